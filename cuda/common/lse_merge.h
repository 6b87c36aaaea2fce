// The arithmetic of merging split-KV partial results, shared by every merge: the CPU kernel's
// combine (cuda/cpu/decode_cpu.cc), the combine kernel (cuda/common/combine.cu) and the SM90
// kernel's in-kernel merge (cuda/sm90/split_merge.cuh). Each caller keeps its own data movement
// (which thread reads which split, how the partial rows are summed); the weights, their -inf / NaN
// rules and the merged LSE are only here.
//
// Each split s of a request produced, for every query row, an output O_s already divided by its
// own softmax sum and the natural-log sum-exp lse_s of its scaled scores (-inf when the split saw
// no visible key for that row). The merged result is
//   lse = log(sum_s exp(lse_s)),  O = sum_s exp(lse_s - lse) * O_s,
// computed against the largest lse_s, m, so that nothing overflows:
//   weight_s = exp(lse_s - m) / sum_s' exp(lse_s' - m),  lse = m + log(sum_s exp(lse_s - m)).
// Rules: a row for which every split is -inf (no visible keys) gets O = 0 and lse = -inf, never
// NaN (every weight is 0); a NaN lse_s (a bad request, or NaN data) makes the row's O and lse NaN.
// fmaxf drops NaN, so NaN is tracked apart from the max.
#pragma once

#include <cmath>

#include "config.h"

namespace jax_mla {

// The merge of one output row over its splits, built in three steps:
//   1. include_lse(w, lse_s) for every split (from kEmptyRowWeights): the max m and the NaN flag;
//   2. w.sum = the sum of lse_weight(lse_s, w.m) over the splits; w.inv = inv_weight_sum(w.m, w.sum);
//   3. split s weighs split_weight(w, lse_s); the row's LSE is merged_lse(w), its O NaN when w.bad.
// The GPU merges run steps 1 and 2 with a warp's lanes striding over the splits (row_math.cuh,
// combine.cu); the CPU kernel runs them in a loop (row_weights_serial).
struct RowWeights {
  float m;    // max LSE, -inf when no split saw a key
  float inv;  // 1 / sum_s exp(lse_s - m), 0 when m is -inf
  float sum;  // sum_s exp(lse_s - m)
  bool bad;   // some LSE is NaN
};

MLA_HOST_DEVICE bool lse_is_nan(float x) {
#if defined(__CUDA_ARCH__)
  return isnan(x);
#else
  return std::isnan(x);
#endif
}

// Step 1, one split.
MLA_HOST_DEVICE void include_lse(RowWeights& w, float lse) {
  w.bad |= lse_is_nan(lse);
  w.m = fmaxf(w.m, lse);
}

// Step 2: split s's unnormalised weight exp(lse_s - m); 0 when no split saw a key (m = -inf), so
// that -inf - -inf never makes a NaN. lse is taken by reference so that a caller's load of it
// stays behind the m test.
MLA_HOST_DEVICE float lse_weight(const float& lse, float m) { return m == -INFINITY ? 0.f : expf(lse - m); }

// Step 2: 1 / sum, 0 when no split saw a key.
MLA_HOST_DEVICE float inv_weight_sum(float m, float sum) { return m == -INFINITY ? 0.f : 1.f / sum; }

// Step 3: split s's normalised weight (lse by reference, as in lse_weight).
MLA_HOST_DEVICE float split_weight(const RowWeights& w, const float& lse) {
  return w.m == -INFINITY ? 0.f : expf(lse - w.m) * w.inv;
}

// Step 3: the merged row's LSE: NaN if any split's was, -inf if no split saw a key.
MLA_HOST_DEVICE float merged_lse(const RowWeights& w) {
  return w.bad ? NAN : (w.m == -INFINITY ? -INFINITY : w.m + logf(w.sum));
}

// Steps 1 and 2 in one thread, over the n LSEs lse[0], lse[stride], ... (n >= 1).
MLA_HOST_DEVICE RowWeights row_weights_serial(const float* lse, int n, int stride) {
  RowWeights w{-INFINITY, 0.f, 0.f, false};
  for (int s = 0; s < n; ++s) include_lse(w, lse[s * stride]);
  for (int s = 0; s < n; ++s) w.sum += lse_weight(lse[s * stride], w.m);
  w.inv = inv_weight_sum(w.m, w.sum);
  return w;
}

}  // namespace jax_mla
