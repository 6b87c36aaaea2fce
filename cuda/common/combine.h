// Merging split-KV partial results: the math shared by the CPU kernel and the GPU combine
// kernel (cuda/common/combine.cu).
//
// Each split s of a request produced, for every query row, an output O_s already divided by its
// own softmax sum and the natural-log sum-exp lse_s of its scaled scores (-inf when the split saw
// no visible key for that row). The merged result is
//   lse = log(sum_s exp(lse_s)),  O = sum_s exp(lse_s - lse) * O_s,
// computed with the running maximum subtracted so that nothing overflows. A row for which every
// split is -inf (no visible keys) gets O = 0 and lse = -inf, never NaN; a NaN split makes the row NaN.
#pragma once

#include <cmath>

#include "config.h"

namespace jax_mla {

struct CombineWeights {
  float lse;  // merged log-sum-exp, -inf when no split saw a key
  int num;    // number of splits
};

// Writes exp(lse_s - lse) into weights[0..num) and returns the merged lse.
MLA_HOST_DEVICE float combine_weights(const float* lse_parts, int num, int stride, float* weights) {
  float m = -INFINITY;
  bool nan = false;  // fmaxf drops NaN; a NaN split (NaN data) must make the merged row NaN
  for (int s = 0; s < num; ++s) {
    const float v = lse_parts[s * stride];
    nan |= v != v;
    m = fmaxf(m, v);
  }
  if (nan) {
    for (int s = 0; s < num; ++s) weights[s] = NAN;
    return NAN;
  }
  if (m == -INFINITY) {
    for (int s = 0; s < num; ++s) weights[s] = 0.f;
    return -INFINITY;
  }
  float sum = 0.f;
  for (int s = 0; s < num; ++s) {
    const float w = expf(lse_parts[s * stride] - m);  // exp(-inf) == 0 for empty splits
    weights[s] = w;
    sum += w;
  }
  const float inv = 1.f / sum;
  for (int s = 0; s < num; ++s) weights[s] *= inv;
  return m + logf(sum);
}

}  // namespace jax_mla
