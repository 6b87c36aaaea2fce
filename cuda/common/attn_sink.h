// The attention sink of the sparse decode on the GPU (runtime/sparse_launch.h): applied to the
// finished output of the decode, out[row] /= attn_sink_divisor(sink, lse[row])
// (common/sparse_problem.h, the CPU kernel's rule), lse unchanged. CUDA builds only.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

#include "problem.h"

namespace jax_mla {

// Over rows = b * seq_q * heads_q output rows (row = (r * seq_q + t) * heads_q + h):
//   out        (rows, 512) of dtype, in place
//   lse        (rows) float32; rows with lse = -inf (no counted slot) are left at 0
//   attn_sink  (heads_q), or (b, heads_q) when per_request
// One warp per row, in stream order after the decode, nothing allocated (CUDA-graph safe).
cudaError_t launch_attn_sink(DType dtype, void* out, const float* lse, const float* attn_sink, bool per_request,
                             int64_t rows, int seq_q, int heads_q, cudaStream_t stream);

}  // namespace jax_mla
