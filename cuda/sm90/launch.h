// Host entry points of the SM90 decode kernel.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "../common/params.h"

namespace jax_mla::sm90 {

// One-time per-device setup (opt-in shared memory); call from the FFI initialize stage.
template <typename Element>
cudaError_t setup_decode();

// Launches the decode kernel over grid (p.num_parts, ceil(p.rows / 64)) with programmatic
// dependent launch. q_map: (b * rows, 576) box (64, 64); kv_map: (num_pages * page_size, 576)
// box (min(page_size, 64), 64).
template <typename Element>
cudaError_t launch_decode(const DecodeParams& p, const CUtensorMap& q_map, const CUtensorMap& kv_map,
                          cudaStream_t stream);

}  // namespace jax_mla::sm90
