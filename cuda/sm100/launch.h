// Host entry points of the SM100 (B200/GB200/B300) decode kernel; the same shapes as sm90/launch.h.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "../common/problem.h"
#include "../common/watchdog_params.h"

namespace jax_mla::sm100 {

// One-time per-device setup (opt-in shared memory of both instantiations of the cache format);
// call from the FFI initialize stage.
template <typename Element, KvFormat kFormat = KvFormat::kDense>
cudaError_t setup_decode();

// Launches the decode kernel over grid (p.num_parts, ceil(p.rows / 64)), 384 threads, with
// programmatic dependent launch (launch_combine follows it, as for SM90). The tensor maps are made
// exactly like the SM90 ones (cuda/runtime/decode_launch.cu, make_tensor_map_2d, 128-byte swizzle):
// q_map: (b * rows, 576) box (64 rows, 64 cols); kv_map: (num_pages * page_size, 576) box
// (min(page_size, 64) rows, 64 cols); kv_rope_map and kv_scale_map unused. FP8 cache (kFormat kFp8,
// fp8_tiles.cuh), the SM90 kernel's views: kv_map the cache as (tokens, 656) bytes in boxes of
// (min(page_size, 64), 128); kv_rope_map as (tokens, 328) bf16 in boxes of (min(page_size, 64), 64)
// with the 128-byte swizzle; kv_scale_map as bytes in boxes of (min(page_size, 64), 16). Only valid
// on a device of compute capability 10.0 or 10.3; the caller dispatches. watchdog: null for the
// production kernel, else the self-check's instantiation with bounded waits (common/watchdog.cuh).
template <typename Element, KvFormat kFormat = KvFormat::kDense>
cudaError_t launch_decode(const DecodeProblem& p, const CUtensorMap& q_map, const CUtensorMap& kv_map,
                          const CUtensorMap& kv_rope_map, const CUtensorMap& kv_scale_map, cudaStream_t stream,
                          const WatchdogParams* watchdog = nullptr);

}  // namespace jax_mla::sm100
