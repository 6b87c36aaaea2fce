// See sparse_launch.h.
#include "runtime/sparse_launch.h"

#include <cstdint>

#include "common/attn_sink.h"
#include "common/sparse_table.h"
#include "common/workspace.h"

namespace jax_mla {

DecodeProblem one_token_page_view(const SparseProblem& p, int num_parts, ChunkSpec chunks, const int32_t* block_table,
                                  const int32_t* seq_lens) {
  DecodeProblem d{};
  d.batch = p.batch * p.seq_q;  // one request per query token, row = head
  d.seq_q = 1;
  d.heads_q = p.heads_q;
  d.rows = p.heads_q;
  d.num_pages = static_cast<int>(p.num_slots);  // pages of one token: page id = flat slot
  d.page_size = 1;
  d.max_pages = p.topk;  // a request's table row holds at most its topk indices
  d.num_parts = num_parts;
  d.dtype = p.dtype;
  d.kv_format = p.kv_format;
  d.softmax_scale = p.softmax_scale;
  d.causal = false;  // every selected slot is visible to its token
  d.chunks = chunks;
  // q (b, s_q, h_q, 576), out (b, s_q, h_q, 512) and lse (b, s_q, h_q) are, in memory, the
  // (b * s_q, 1, h_q, .) arrays of the view.
  d.q = p.q;
  d.kv_cache = p.kv_cache;  // (num_slots, 576 | 656)
  d.block_table = block_table;
  d.seq_lens = seq_lens;
  d.schedule = nullptr;  // planned in the op, on the device: the lengths are device data
  d.out = p.out;
  d.lse = p.lse;
  d.partial_lse = nullptr;
  d.partial_out = nullptr;
  return d;
}

LaunchStatus launch_sparse_decode(const SparseProblem& p, int num_parts, ChunkSpec chunks, void* workspace,
                                  int sm_count, cudaStream_t stream, Kernel kernel) {
  LaunchStatus st;
  const int queries = p.batch * p.seq_q;
  const SparseWorkspaceLayout layout =
      sparse_workspace_layout(queries, p.heads_q, p.topk, num_parts, chunks.max_chunks);
  uint8_t* ws = static_cast<uint8_t*>(workspace);
  int32_t* table = reinterpret_cast<int32_t*>(ws + layout.table_offset);      // (queries, topk)
  int32_t* lengths = reinterpret_cast<int32_t*>(ws + layout.lengths_offset);  // (queries)
  if ((st.error = launch_sparse_table(p.indices, p.topk_length, queries, p.seq_q, p.topk, table, lengths, stream)) !=
      cudaSuccess) {
    st.what = "sparse table kernel launch";
    return st;
  }
  DecodeProblem d = one_token_page_view(p, num_parts, chunks, table, lengths);
  const WorkspaceScratch scratch = attach_workspace(d, workspace);  // the decode's part is first
  // The SM90 kernel merges its splits itself where its grid fits (the counters zeroed by the
  // scheduler kernel); the portable kernel's are merged by the combine kernel.
  st = launch_decode_kernel(kernel, d, sm_count, kernel == Kernel::kSm90 ? scratch.merge_counters : nullptr,
                            scratch.schedule_scratch, stream);
  if (!st.ok()) return st;
  if (p.attn_sink != nullptr) {
    if ((st.error = launch_attn_sink(p.dtype, p.out, p.lse, p.attn_sink, p.sink_per_request,
                                     static_cast<int64_t>(queries) * p.heads_q, p.seq_q, p.heads_q, stream)) !=
        cudaSuccess) {
      st.what = "attention sink kernel launch";
    }
  }
  return st;
}

}  // namespace jax_mla
