// The sparse decode problem (jax_mla_decode_sparse, DeepSeek-V3.2 DSA): each query token attends to
// its own list of selected cache slots instead of a request's prefix. What both platforms are
// asked to compute (the CPU kernel, cpu/sparse_cpu.h; the GPU path, runtime/sparse_launch.h), and
// the two rules they share: which indices count, and how the attention sink scales a row.
// Filled by the FFI handlers after validation (ffi/sparse_args.h). Host and device.
#pragma once

#include <cmath>
#include <cstdint>

#include "config.h"
#include "problem.h"

namespace jax_mla {

struct SparseProblem {
  int batch, seq_q, heads_q;  // q (b, s_q, h_q, 576)
  int topk;                   // indices (b, s_q, topk)
  int64_t num_slots;          // num_pages * page_size: rows of the cache, flat slot ids (<= INT32_MAX)
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

// n of request r: the first n indices of each of its tokens count; topk_length[r] clamped to
// [0, topk] (traced values are not checked), topk without topk_length (null).
MLA_HOST_DEVICE int counted_indices(const int32_t* topk_length, int r, int topk) {
  if (topk_length == nullptr) return topk;
  const int32_t n = topk_length[r];
  return n < 0 ? 0 : (n > topk ? topk : n);
}

inline int sparse_count(const SparseProblem& p, int r) { return counted_indices(p.topk_length, r, p.topk); }

// Index of head h's sink of request r in attn_sink ((h_q) or, per request, (b, h_q)).
MLA_HOST_DEVICE int64_t sink_index(bool per_request, int heads_q, int r, int h) {
  return per_request ? static_cast<int64_t>(r) * heads_q + h : h;
}

// The attention sink divides a row's out by 1 + exp(sink - lse) (= (exp(lse) + exp(sink)) /
// exp(lse): the sink logit takes its share of the probability mass), lse unchanged: 1 for a -inf
// sink (out bit for bit the same), inf for a sink far above lse (out 0), NaN when lse is NaN. Only
// rows with a counted slot (lse > -inf) are scaled: an empty row stays out = 0.
MLA_HOST_DEVICE float attn_sink_divisor(float sink, float lse) { return 1.f + expf(sink - lse); }

}  // namespace jax_mla
