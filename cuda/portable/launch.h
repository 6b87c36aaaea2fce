// Host entry points of the portable decode kernel (SM80 and later), the same as sm90/launch.h
// without the TMA descriptors: it gathers the cache rows itself with cp.async.
#pragma once

#include <cuda_runtime.h>

#include "../common/problem.h"

namespace jax_mla::portable {

// One-time per-device setup (opt-in shared memory, 88 KB); call from the FFI initialize stage.
template <typename Element>
cudaError_t setup_decode();

// Launches the decode kernel over num_parts * ceil(p.rows / 32) CTAs in plain stream order (no
// programmatic dependent launch: the same code runs from PTX on GPUs without it). p.schedule must
// be set; the combine kernel runs after it (launch_combine with programmatic = false).
template <typename Element>
cudaError_t launch_decode(const DecodeProblem& p, cudaStream_t stream);

}  // namespace jax_mla::portable
