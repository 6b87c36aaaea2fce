// The CPU sparse decode kernel (DeepSeek-V3.2 DSA): each query token attends to its own list of
// selected cache slots instead of a request's prefix. The "cpu" platform implementation of the
// jax_mla_decode_sparse FFI target (ffi/cpu_sparse_handler.cc).
#pragma once

#include <cstdint>

#include "common/problem.h"

namespace jax_mla {

struct SparseProblem {
  int batch, seq_q, heads_q;  // q (b, s_q, h_q, 576)
  int topk;                   // indices (b, s_q, topk)
  int64_t num_slots;          // num_pages * page_size: rows of the cache, flat slot ids
  DType dtype;                // q's and out's dtype (and a dense cache's)
  KvFormat kv_format;
  float softmax_scale;
  const void* q;              // (b, s_q, h_q, 576)
  const void* kv_cache;       // (num_slots, 576) q's dtype or (num_slots, 656) uint8
  const int32_t* indices;     // (b, s_q, topk)
  const int32_t* topk_length; // (b) or null (every index counts)
  const float* attn_sink;     // (h_q), or (b, h_q) when sink_per_request (vmap), or null (no sink)
  bool sink_per_request;
  void* out;                  // (b, s_q, h_q, 512) q's dtype
  float* lse;                 // (b, s_q, h_q)
};

// Row (r, t, h): softmax over the selected slots of indices[r, t, :n], n = topk_length[r] clamped to
// [0, topk] (topk when topk_length is null), skipping -1; a slot listed twice counts twice. out is
// the probabilities times the slots' first 512 columns, lse the natural log-sum-exp of the scaled
// scores; with no valid slot out = 0 and lse = -inf. With attn_sink, out is then multiplied by
// exp(lse) / (exp(lse) + exp(attn_sink[h])) (lse unchanged).
// Precondition (the handler checks it): every counted index is -1 or in [0, num_slots).
void decode_sparse_cpu(const SparseProblem& p, bool baseline_gemm = false, int max_threads = 0);

// n of request r: topk_length[r] clamped to [0, topk].
inline int sparse_count(const SparseProblem& p, int r) {
  if (p.topk_length == nullptr) return p.topk;
  const int32_t n = p.topk_length[r];
  return n < 0 ? 0 : (n > p.topk ? p.topk : n);
}

}  // namespace jax_mla
