// Per-row math of the online softmax, shared by the GPU decode kernels (SM90 wgmma, portable
// mma.sync). In both accumulator layouts a thread holds two rows of a 16-row slice, and the four
// lanes of a quad (lane / 4 equal) hold the same two rows, so a row reduction inside a warp is two
// xor-shuffles. Scores are in log2 units (the softmax scale times log2(e) is folded in before exp2).
#pragma once

#include <cmath>
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <type_traits>

#include "lse_merge.h"

namespace jax_mla {

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffff, x, 1);
  return x + __shfl_xor_sync(0xffffffff, x, 2);
}

// Over all 32 lanes (the split merges: combine.cu, sm90/split_merge.cuh, where lanes stride over splits).
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, d));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) x += __shfl_xor_sync(0xffffffff, x, d);
  return x;
}

// The merge weights of one output row over its splits' LSEs (lse_merge.h), computed by a whole warp
// whose lanes stride over the splits, so every lane has them: split s weighs exp(lse_s - m) * inv.
// Used by the SM90 decode kernel's own merge (sm90/split_merge.cuh), from LSEs held in registers:
// lane l's l[k] is split l + 32 k (-inf past the last split). Also leaves exp(l[k] - m) in w[k]
// (unnormalised; 0 for -inf), for the lane that holds split s to share.
template <int K>
__device__ __forceinline__ RowWeights row_weights_of(const float (&l)[K], float (&w)[K]) {
  RowWeights r;
  r.m = -INFINITY;
  r.bad = false;
#pragma unroll
  for (int k = 0; k < K; ++k) include_lse(r, l[k]);
  r.m = warp_max(r.m);
  r.bad = __any_sync(0xffffffff, r.bad);
  r.sum = 0.f;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    w[k] = lse_weight(l[k], r.m);
    r.sum += w[k];
  }
  r.sum = warp_sum(r.sum);
  r.inv = inv_weight_sum(r.m, r.sum);
  return r;
}

// The running max is -inf until a row has seen a key; exp2 then needs a finite reference point
// so that -inf - -inf never makes a NaN.
__device__ __forceinline__ float finite_or_zero(float m) { return m == -INFINITY ? 0.f : m; }

// Two floats rounded to the 16-bit element type, packed into one 32-bit register (low half first):
// the operand format of the 16-bit MMAs and of paired 16-bit stores.
template <typename Element>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
}

// The inverse of pack2: two 16-bit elements of one 32-bit word (low half first) as floats (exact).
template <typename Element>
__device__ __forceinline__ float2 unpack2(uint32_t w) {
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
  } else {
    return __half22float2(*reinterpret_cast<const __half2*>(&w));
  }
}

// One float rounded to the 16-bit element type.
template <typename Element>
__device__ __forceinline__ Element to_element(float x) {
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
    return __float2bfloat16_rn(x);
  } else {
    return __float2half_rn(x);
  }
}

struct RowResult {
  float inv_sum[2];  // 1 / row sum, 0 for rows that saw no key
  float lse[2];      // natural log-sum-exp, -inf for rows that saw no key, NaN for a bad request
};

// m: running max (log2 units), total_sum: the full row sum. A bad request (invalid page id or a
// length its block table cannot hold) makes both NaN, so its output is NaN whatever O holds.
__device__ __forceinline__ RowResult finish_rows(const float (&m)[2], const float (&total_sum)[2], bool bad) {
  RowResult r;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const bool empty = total_sum[i] == 0.f;  // NaN data stays NaN
    r.inv_sum[i] = bad ? NAN : (empty ? 0.f : 1.f / total_sum[i]);
    r.lse[i] = bad ? NAN : (empty ? -INFINITY : (m[i] + log2f(total_sum[i])) * 0.69314718055994531f);
  }
  return r;
}

}  // namespace jax_mla
