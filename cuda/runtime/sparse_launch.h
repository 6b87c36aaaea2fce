// Launching one sparse decode (jax_mla_decode_sparse) on a CUDA device. No kernel of its own: the
// call is run as a dense decode that the portable kernel (any cache) or the SM90 / SM100 kernel (an
// FP8 cache: its producer warp gathers the rows) already computes, over a view of the problem
// (docs/design.md, "Sparse decode"):
//   - request r' = (r, t) for each query token (batch' = b * s_q, seq_q' = 1, rows = h_q, not causal);
//   - the cache seen as pages of ONE token (num_pages' = num_pages * page_size, page_size' = 1), so
//     a flat slot index is a page id, whatever the cache's own page size;
//   - request r''s block table row = its counted indices without the -1 entries, in order, and
//     seq_len' their count (common/sparse_table.h, one compaction kernel).
// Then the kernel's scheduler, decode and merge run unchanged, and with them their rules:
// an index outside the cache is a page id outside [0, num_pages') below seq_len', which makes that
// query token's out and lse NaN (the kernel's bad-page rule, through the split merge) and is never
// read; a token with no counted index is an empty request (out 0, lse -inf). The attention sink,
// when given, scales out afterwards (common/attn_sink.h). Host code only: nothing here allocates,
// synchronises or queries the stream, so it is safe under CUDA-graph capture.
#pragma once

#include <cuda_runtime.h>

#include "common/sparse_problem.h"
#include "runtime/decode_launch.h"

namespace jax_mla {

// p: the validated problem (device pointers). chunks: the batch-invariant plan ({0, 0}: the
// default plans; a query token is one request of the view, so its bits then depend on its own
// indices alone). workspace: sparse_workspace_layout(b * s_q, h_q, topk, num_parts,
// chunks.max_chunks).total_bytes bytes (common/workspace.h). sm_count: the device's SMs, for the
// combine's grid. The portable kernel must read p.kv_format (the caller selects it).
// kernel: kPortable, or kSm90 / kSm100 for an FP8 cache (kernel_select.h sparse_kernel: their
// producer warp gathers the one-token pages).
LaunchStatus launch_sparse_decode(const SparseProblem& p, int num_parts, ChunkSpec chunks, void* workspace,
                                  int sm_count, cudaStream_t stream, Kernel kernel);

// The dense decode the GPU runs for p (the view above), with block_table and seq_lens the
// compacted lists; the split-KV scratch (partial_lse, partial_out) is left null.
DecodeProblem one_token_page_view(const SparseProblem& p, int num_parts, ChunkSpec chunks, const int32_t* block_table,
                                  const int32_t* seq_lens);

}  // namespace jax_mla
