// Online softmax of the SM90 consumers, on a 64 x 64 score tile held in wgmma accumulator layout.
//
// Scores are kept in log2 units (scale * log2(e) folded into one FMA before exp2). Every row of a
// tile lives in one quad of lanes (4 threads x 16 values), so row reductions are two shuffles.
// The two consumers compute different tiles of a pair but share one running max per row: each
// publishes its tile's row max, both take the max of both, so their P tiles and the rescaling of
// their halves of O agree exactly.
#pragma once

#include <cmath>
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../common/ptx.cuh"

namespace jax_mla::sm90 {

// Accumulator fragment of a 64 x 64 fp32 tile: s[4 * j + 2 * i + e] is element
// (row = row_in_tile(i), col = 8 j + 2 (lane % 4) + e).
using ScoreFragment = float[32];

struct RowCoords {
  int row[2];  // this thread's two rows in the 64-row tile
  int quad_col;  // 2 * (lane % 4): first of the thread's two columns in each 8-column group
  __device__ __forceinline__ explicit RowCoords(int thread_in_wg) {
    const int warp = thread_in_wg / 32, lane = thread_in_wg % 32;
    row[0] = warp * 16 + lane / 4;
    row[1] = row[0] + 8;
    quad_col = 2 * (lane % 4);
  }
};

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffff, x, 1);
  return x + __shfl_xor_sync(0xffffffff, x, 2);
}

// Sets scores of keys a row may not see (token >= visible[i]) to -inf. Select, not multiply:
// masked K rows may hold anything, NaN included.
__device__ __forceinline__ void mask_scores(ScoreFragment& s, const RowCoords& rc, int first_token,
                                            const int (&visible)[2]) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int token = first_token + 8 * j + rc.quad_col + e;
        if (token >= visible[i]) s[4 * j + 2 * i + e] = -INFINITY;
      }
}

// Row max of the tile in log2 units (scale_log2 > 0), reduced over the quad.
__device__ __forceinline__ void tile_row_max(const ScoreFragment& s, float scale_log2, float (&mx)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float m = -INFINITY;
#pragma unroll
    for (int j = 0; j < 8; ++j) m = fmaxf(m, fmaxf(s[4 * j + 2 * i], s[4 * j + 2 * i + 1]));
    mx[i] = quad_max(m) * scale_log2;
  }
}

// The running max is -inf until a row has seen a key; exp2 then needs a finite reference point
// so that -inf - -inf never makes a NaN.
__device__ __forceinline__ float finite_or_zero(float m) { return m == -INFINITY ? 0.f : m; }

// P = exp2(s * scale_log2 - m) in place; returns this thread's partial row sums.
__device__ __forceinline__ void exponentiate(ScoreFragment& s, float scale_log2, const float (&m_ref)[2],
                                             float (&partial_sum)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = s[4 * j + 2 * i + e];
        x = ptx::exp2_approx(fmaf(x, scale_log2, -m_ref[i]));
        sum += x;
      }
    partial_sum[i] = sum;
  }
}

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

// P (64 x 64) as the register A operand of four m64n256k16 wgmmas: a[kk] covers keys 16kk..16kk+15.
template <typename Element>
__device__ __forceinline__ void p_to_operand(const ScoreFragment& p, uint32_t (&a)[4][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    a[kk][0] = pack2<Element>(p[8 * kk + 0], p[8 * kk + 1]);  // (row,     keys 16kk + 2q + {0,1})
    a[kk][1] = pack2<Element>(p[8 * kk + 2], p[8 * kk + 3]);  // (row + 8, same keys)
    a[kk][2] = pack2<Element>(p[8 * kk + 4], p[8 * kk + 5]);  // (row,     keys + 8)
    a[kk][3] = pack2<Element>(p[8 * kk + 6], p[8 * kk + 7]);  // (row + 8, keys + 8)
  }
}

// Writes P into a (64 x 64) 16-bit box with the 128-byte swizzle, K-major (row = query row,
// contiguous along keys): exactly the layout a TMA box has, so the other consumer reads it with
// the same kind of descriptor as Q. The 16-byte chunk j of row r sits at chunk j ^ (r % 8).
__device__ __forceinline__ void store_p_swizzled(const uint32_t (&a)[4][4], const RowCoords& rc, uint8_t* box) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int half = 0; half < 2; ++half) {  // 8-key group j = 2kk + half
      const int j = 2 * kk + half;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int r = rc.row[i];
        uint8_t* dst = box + r * 128 + ((j ^ (r & 7)) << 4) + rc.quad_col * 2;
        *reinterpret_cast<uint32_t*>(dst) = a[kk][2 * half + i];
      }
    }
}

}  // namespace jax_mla::sm90
