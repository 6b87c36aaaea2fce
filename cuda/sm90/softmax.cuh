// Online softmax of the SM90 consumers. Each consumer holds the scores of its half of a 64-key
// tile, (64 rows, 32 keys), in wgmma accumulator layout.
//
// Scores are kept in log2 units (scale * log2(e) folded into one FMA before exp2). Every row of a
// half tile lives in one quad of lanes (4 threads x 8 values), so row reductions are two shuffles.
// The two consumers share one running max per row: each publishes its half's row max and both
// take the max of both, so their P halves and the rescaling of their halves of O agree exactly.
#pragma once

#include <cmath>
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../common/ptx.cuh"
#include "../common/row_math.cuh"

namespace jax_mla::sm90 {

// Keys per consumer in one tile.
inline constexpr int kKeysPerConsumer = 32;

// Accumulator fragment of a (64, 32) fp32 half tile: s[4 * j + 2 * i + e] is element
// (row = RowCoords::row[i], key = 8 j + 2 (lane % 4) + e), j in [0, 4).
using ScoreFragment = float[kKeysPerConsumer / 2];

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

// Sets scores of keys a row may not see (token >= visible[i]) to -inf. Select, not multiply:
// masked K rows may hold anything, NaN included.
__device__ __forceinline__ void mask_scores(ScoreFragment& s, const RowCoords& rc, int first_token,
                                            const int (&visible)[2]) {
#pragma unroll
  for (int j = 0; j < kKeysPerConsumer / 8; ++j)
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
    for (int j = 0; j < kKeysPerConsumer / 8; ++j) m = fmaxf(m, fmaxf(s[4 * j + 2 * i], s[4 * j + 2 * i + 1]));
    mx[i] = quad_max(m) * scale_log2;
  }
}

// P = exp2(s * scale_log2 - m) in place; returns this thread's partial row sums.
__device__ __forceinline__ void exponentiate(ScoreFragment& s, float scale_log2, const float (&m_ref)[2],
                                             float (&partial_sum)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < kKeysPerConsumer / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = s[4 * j + 2 * i + e];
        x = ptx::exp2_approx(fmaf(x, scale_log2, -m_ref[i]));
        sum += x;
      }
    partial_sum[i] = sum;
  }
}

// Writes this consumer's P half, keys [32 c, 32 c + 32) of the tile, into the (64 rows, 64 keys)
// 16-bit P box: 128-byte swizzle, K-major (row = query row, contiguous along keys), exactly the
// layout of a TMA box, so P V reads it with the same kind of descriptor as Q. The 16-byte chunk k
// of row r sits at chunk k ^ (r % 8).
template <typename Element>
__device__ __forceinline__ void store_p_half(const ScoreFragment& p, const RowCoords& rc, int consumer, uint8_t* box) {
#pragma unroll
  for (int j = 0; j < kKeysPerConsumer / 8; ++j) {
    const int chunk = consumer * (kKeysPerConsumer / 8) + j;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = rc.row[i];
      uint8_t* dst = box + r * 128 + ((chunk ^ (r & 7)) << 4) + rc.quad_col * 2;
      *reinterpret_cast<uint32_t*>(dst) = pack2<Element>(p[4 * j + 2 * i], p[4 * j + 2 * i + 1]);
    }
  }
}

}  // namespace jax_mla::sm90
