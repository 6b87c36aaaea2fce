// Layout of the device workspace the CUDA handler receives as an extra XLA output (no runtime
// allocation, so the op can be captured in a CUDA graph). One formula, exported to Python by the
// extension module (workspace_bytes), so the lowering and the handler cannot disagree.
#pragma once

#include <cstdint>

#include "config.h"
#include "problem.h"
#include "scheduler.h"

namespace jax_mla {

MLA_HOST_DEVICE int64_t align_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

struct WorkspaceLayout {
  int64_t schedule_offset;     // int32 (schedule_size(b, num_parts, invariant)), used when no schedule is passed in
  int64_t partial_lse_offset;  // float (max_splits, rows)
  int64_t partial_out_offset;  // float (max_splits, rows, 512)
  int64_t merge_counters_offset;  // int32 (b, ceil(rows / kBlockM)): arrivals of a request's pieces (SM90 merge)
  int64_t total_bytes;
};

// The SM90 split merge's arrival counters: one int32 per (request, row block).
MLA_HOST_DEVICE int64_t merge_counters_bytes(int64_t batch, int64_t rows) {
  return batch * num_row_blocks(static_cast<int>(rows)) * 4;  // rows <= kMaxSeqQ * kMaxHeadsQ
}

// max_chunks: the batch-invariant plan's S (ChunkSpec::max_chunks), 0 for the default plans.
MLA_HOST_DEVICE WorkspaceLayout workspace_layout(int64_t batch, int64_t rows, int64_t num_parts,
                                                 int64_t max_chunks = 0) {
  WorkspaceLayout w;
  const int64_t splits = max_splits(batch, num_parts, max_chunks);
  w.schedule_offset = 0;
  w.partial_lse_offset = align_up(schedule_size(batch, num_parts, max_chunks > 0) * 4, 256);
  w.partial_out_offset = w.partial_lse_offset + align_up(splits * rows * 4, 256);
  w.merge_counters_offset = w.partial_out_offset + splits * rows * kHeadDimV * 4;
  w.total_bytes = w.merge_counters_offset + merge_counters_bytes(batch, rows);
  return w;
}

// The split-KV scratch of a DecodeProblem, carved out of a workspace laid out by workspace_layout
// for its batch, rows, num_parts and chunks (the CUDA handlers' workspace result, or its first
// part in the sparse one's): sets p.partial_lse / p.partial_out, returns the rest.
struct WorkspaceScratch {
  int* merge_counters;        // (b, row blocks) the SM90 in-kernel merge's counters
  int32_t* schedule_scratch;  // where the in-op schedule goes
};
inline WorkspaceScratch attach_workspace(DecodeProblem& p, void* workspace) {
  uint8_t* ws = static_cast<uint8_t*>(workspace);
  const WorkspaceLayout layout = workspace_layout(p.batch, p.rows, p.num_parts, p.chunks.max_chunks);
  p.partial_lse = reinterpret_cast<float*>(ws + layout.partial_lse_offset);
  p.partial_out = reinterpret_cast<float*>(ws + layout.partial_out_offset);
  return {reinterpret_cast<int*>(ws + layout.merge_counters_offset),
          reinterpret_cast<int32_t*>(ws + layout.schedule_offset)};
}

// The workspace of jax_mla_decode_sparse on CUDA (runtime/sparse_launch.h), which runs the sparse
// call as a dense decode of `queries` = b * s_q one-token requests of heads_q rows over pages of one
// token: that decode's workspace (planned in the op; max_chunks: its batch-invariant plan's S, 0 for
// the default plans) first, then the requests' block table (their compacted index lists) and lengths.
struct SparseWorkspaceLayout {
  WorkspaceLayout decode;  // at offset 0
  int64_t table_offset;    // int32 (queries, topk)
  int64_t lengths_offset;  // int32 (queries)
  int64_t total_bytes;
};

MLA_HOST_DEVICE SparseWorkspaceLayout sparse_workspace_layout(int64_t queries, int64_t heads_q, int64_t topk,
                                                              int64_t num_parts, int64_t max_chunks = 0) {
  SparseWorkspaceLayout w;
  w.decode = workspace_layout(queries, heads_q, num_parts, max_chunks);
  w.table_offset = align_up(w.decode.total_bytes, 256);
  w.lengths_offset = align_up(w.table_offset + queries * topk * 4, 256);
  w.total_bytes = w.lengths_offset + queries * 4;
  return w;
}

}  // namespace jax_mla
