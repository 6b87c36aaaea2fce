// The block table of the sparse decode's dense view (runtime/sparse_launch.h): the GPU runs a
// sparse call as a dense decode over pages of ONE token, one request per query token (b * s_q of
// them), whose block table row is the token's list of counted indices. CUDA builds only.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

namespace jax_mla {

// For every query token q = r * seq_q + t (queries = b * seq_q of them): writes the indices of
// indices[q, :n] that are not -1, in order, to the front of table[q, :] and their count to
// lengths[q], n = counted_indices(topk_length, r, topk) (common/sparse_problem.h). Any other index
// stays, out-of-range ones included: the decode kernel finds no page for it and makes that token's
// output NaN (never reads it). table[q, lengths[q]:] is left as it was (never read).
//   indices     (queries, topk) int32
//   topk_length (b) int32, or null
//   table       (queries, topk) int32
//   lengths     (queries) int32
// One CTA per query token, in stream order, nothing allocated (CUDA-graph safe).
cudaError_t launch_sparse_table(const int32_t* indices, const int32_t* topk_length, int queries, int seq_q, int topk,
                                int32_t* table, int32_t* lengths, cudaStream_t stream);

}  // namespace jax_mla
