// The plain parameter struct every decode kernel (CPU, SM90, SM100, portable) receives.
// Filled by the FFI handlers after validation; no kernel re-derives shapes on its own.
#pragma once

#include <cstdint>

#include "config.h"
#include "scheduler.h"

namespace jax_mla {

enum class DType : int { kBF16 = 0, kF16 = 1 };

struct DecodeParams {
  // Shapes.
  int batch;         // b
  int seq_q;         // s_q, tokens per request in this step (1..kMaxSeqQ)
  int heads_q;       // h_q
  int rows;          // s_q * h_q: query rows of one request, row = t * h_q + h
  int num_pages;     // pages in the cache
  int page_size;     // tokens per page
  int max_pages;     // columns of the block table
  int num_parts;     // parts of the split-KV schedule
  DType dtype;

  float softmax_scale;  // multiplies q . k
  bool causal;          // query token t sees positions < seq_len - s_q + t + 1

  // The device's SM count (set by the CUDA handler) for sizing persistent grids (0: unknown, the
  // launchers assume 132).
  int sm_count = 0;

  // SM90: merge the split-KV partials inside the decode kernel instead of the combine kernel
  // (cuda/sm90/split_merge.cuh). Set by the launcher (decode_launch.cu) when the whole grid fits on
  // the GPU at once (the pieces of a request wait for each other) and merge_counters is given;
  // merge_counters (b, row blocks) int32 are then zeroed before the kernel, by the scheduler kernel
  // or, for a precomputed schedule, a memset.
  bool fused_merge = false;
  int* merge_counters = nullptr;

  // Inputs (device or host pointers, per platform).
  const void* q;                // (b, s_q, h_q, 576)       row-major
  const void* kv_cache;         // (num_pages, page_size, 576) row-major
  const int32_t* block_table;   // (b, max_pages)
  const int32_t* seq_lens;      // (b)
  const int32_t* schedule;      // (schedule_size(b, num_parts)), see scheduler.h

  // Outputs.
  void* out;   // (b, s_q, h_q, 512), q's dtype
  float* lse;  // (b, s_q, h_q), natural log; -inf for rows with no visible key

  // Split-KV scratch (see scheduler.h): slot s, row r.
  float* partial_lse;  // (max_splits(b, num_parts), rows)
  float* partial_out;  // (max_splits(b, num_parts), rows, 512)
};

// Number of keys query token t of a request with `seq_len` cached tokens may see.
MLA_HOST_DEVICE int visible_keys(int seq_len, int seq_q, int t, bool causal) {
  return causal ? (seq_len - seq_q + t + 1 < 0 ? 0 : seq_len - seq_q + t + 1) : seq_len;
}

}  // namespace jax_mla
