// Host entry points of the portable decode kernel (SM80 and later), the same as sm90/launch.h
// without the TMA descriptors: it gathers the cache rows itself with cp.async.
#pragma once

#include <cuda_runtime.h>

#include "../common/problem.h"

namespace jax_mla::portable {

// One-time per-device setup (opt-in shared memory, 88 KB; 93 KB for an FP8 cache); call from the
// FFI initialize stage. kFormat: the cache's row format (KvFormat, common/problem.h).
template <typename Element, KvFormat kFormat = KvFormat::kDense>
cudaError_t setup_decode();

// Launches the decode kernel over num_parts * ceil(p.rows / 32) CTAs in plain stream order (no
// programmatic dependent launch: the same code runs from PTX on GPUs without it). p.schedule must
// be set and p.kv_format be kFormat; the combine kernel runs after it (launch_combine with
// programmatic = false). p.page_size may be any power of two, 1 included: the loader looks a page
// up per token (producer.cuh), so it never assumes the [16, 256] of the TMA kernels; the sparse
// path runs on pages of one token (runtime/sparse_launch.h).
template <typename Element, KvFormat kFormat = KvFormat::kDense>
cudaError_t launch_decode(const DecodeProblem& p, cudaStream_t stream);

}  // namespace jax_mla::portable
