// The decode problem: what every kernel (CPU, SM90, SM100, portable, and the shared scheduler and
// combine kernels) is asked to compute, and nothing about how one GPU launches it. Filled by the
// FFI handlers after validation; no kernel re-derives shapes on its own. Launch choices that only
// one architecture makes (the SM90 in-kernel split merge and its counters, grid sizing from the SM
// count) live in that architecture's launch plan (cuda/sm90/launch_plan.h), so the CPU kernel and
// the other GPU kernels never see them.
#pragma once

#include <cstdint>

#include "config.h"
#include "scheduler.h"

namespace jax_mla {

enum class DType : int { kBF16 = 0, kF16 = 1 };

// How kv_cache stores a token's 576-wide latent row: 576 values of q's dtype (kDense), or the
// 656-byte FP8 row of config.h (kFp8: e4m3 latent values with per-tile scales, bf16 RoPE).
enum class KvFormat : int { kDense = 0, kFp8 = 1 };

struct DecodeProblem {
  // Shapes.
  int batch;         // b
  int seq_q;         // s_q, tokens per request in this step (1..kMaxSeqQ)
  int heads_q;       // h_q
  int rows;          // s_q * h_q: query rows of one request, row = t * h_q + h
  int num_pages;     // pages in the cache
  int page_size;     // tokens per page
  int max_pages;     // columns of the block table
  int num_parts;     // parts of the split-KV schedule
  DType dtype;       // q's and out's element type (and kv_cache's when kv_format is kDense)

  float softmax_scale;  // multiplies q . k
  bool causal;          // query token t sees positions < seq_len - s_q + t + 1
  // The batch-invariant plan's parameters ({0, 0}: the default plans). The kernels walk whatever
  // plan the schedule holds; the launch reads this to plan in the op and size the workspace.
  ChunkSpec chunks;
  // After `chunks`, in what was padding before the pointers: the struct (a __grid_constant__
  // kernel parameter) keeps its size and every other field its offset.
  KvFormat kv_format;

  // Inputs (device or host pointers, per platform).
  const void* q;                // (b, s_q, h_q, 576)       row-major
  const void* kv_cache;         // (num_pages, page_size, 576) row-major, or (..., 656) bytes when kFp8
  const int32_t* block_table;   // (b, max_pages)
  const int32_t* seq_lens;      // (b)
  const int32_t* schedule;      // (schedule_size(b, num_parts)), see scheduler.h

  // Outputs.
  void* out;   // (b, s_q, h_q, 512), q's dtype
  float* lse;  // (b, s_q, h_q), natural log; -inf for rows with no visible key

  // Split-KV scratch (see scheduler.h): slot s, row r.
  float* partial_lse;  // (max_splits(b, num_parts, chunks.max_chunks), rows)
  float* partial_out;  // (max_splits(b, num_parts, chunks.max_chunks), rows, 512)
};

// Number of keys query token t of a request with `seq_len` cached tokens may see.
MLA_HOST_DEVICE int visible_keys(int seq_len, int seq_q, int t, bool causal) {
  return causal ? (seq_len - seq_q + t + 1 < 0 ? 0 : seq_len - seq_q + t + 1) : seq_len;
}

}  // namespace jax_mla
