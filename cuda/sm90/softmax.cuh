// Online softmax of the SM90 consumers. The owner of a KV tile (see mainloop.cuh) holds its
// scores, (64 rows, 64 keys), in wgmma accumulator layout.
//
// Scores are kept in log2 units (scale * log2(e) folded into one FMA before exp2). Every row of a
// tile lives in one quad of lanes (4 threads x 16 values), so row reductions are two shuffles.
// The owner publishes the new reference max of each row with P (lazy: it moves only when the max
// outgrows it by kLazyRescaleSlack; move_reference); the other consumer takes it from shared memory,
// so both rescale their halves of O by bit-identical factors.
#pragma once

#include <cmath>
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "../common/config.h"
#include "../common/ptx.cuh"
#include "../common/row_math.cuh"

namespace jax_mla::sm90 {

// Keys of one score tile (one KV tile).
inline constexpr int kTileKeys = kBlockN;

// Accumulator fragment of a (64, 64) fp32 score tile: s[4 * j + 2 * i + e] is element
// (row = RowCoords::row[i], key = 8 j + 2 (lane % 4) + e), j in [0, 8).
using ScoreFragment = float[kTileKeys / 2];

// P of a tile as the A operand of wgmma m64n256k16 with A in registers, 16-bit: for the keys
// [16 kk, 16 kk + 16), p[4 kk + r] packs two adjacent keys of the accumulator layout:
//   r = 0: (row[0], 16 kk + qc + {0, 1})      r = 1: (row[1], same keys)
//   r = 2: (row[0], 16 kk + 8 + qc + {0, 1})  r = 3: (row[1], same keys)
// which is exactly ScoreFragment entries 8 kk + 2 r + {0, 1}: the accumulator layout of Q K^T is
// the register-A layout of P V, so P never leaves the owner's registers for its own P V.
using PFragment = uint32_t[kTileKeys / 4];

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
  for (int j = 0; j < kTileKeys / 8; ++j)
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
    for (int j = 0; j < kTileKeys / 8; ++j) m = fmaxf(m, fmaxf(s[4 * j + 2 * i], s[4 * j + 2 * i + 1]));
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
    for (int j = 0; j < kTileKeys / 8; ++j)
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
__device__ __forceinline__ void pack_p(const ScoreFragment& p, PFragment& a) {
#pragma unroll
  for (int k = 0; k < kTileKeys / 4; ++k) a[k] = pack2<Element>(p[2 * k], p[2 * k + 1]);
}

// Writes P, (64 rows, 64 keys) 16-bit, into a (64, 64) box: 128-byte swizzle, K-major (row = query
// row, contiguous along keys), exactly the layout of a TMA box, so the other consumer's P V reads
// it with the same kind of descriptor as Q. The 16-byte chunk j of row r sits at chunk j ^ (r % 8);
// a warp's 32 stores of one j hit 8 rows x 4 words in 8 different chunks: no bank conflict.
__device__ __forceinline__ void store_p(const PFragment& a, const RowCoords& rc, uint8_t* box) {
#pragma unroll
  for (int j = 0; j < kTileKeys / 8; ++j) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = rc.row[i];
      uint8_t* dst = box + r * 128 + ((j ^ (r & 7)) << 4) + rc.quad_col * 2;
      *reinterpret_cast<uint32_t*>(dst) = a[2 * j + i];  // keys 8 j + qc + {0, 1} of row[i]
    }
  }
}

// Per-row state of one consumer over one piece: the reference max m (log2 units, the same in both
// consumers after every tile; it may lag the running max by up to kLazyRescaleSlack, see
// move_reference) and this consumer's partial row sums l (its own tiles' P), which are rescaled
// with O. l of both consumers add up to the softmax denominator in the epilogue, whose LSE is
// m + log2(l) for whichever reference m the sums were taken against.
struct RowState {
  float m[2];
  float l[2];
};

// alpha = exp2(m_old - m_new) with a finite reference point for rows that have seen no key yet
// (m = -inf): O and l are still 0 there, and -inf - -inf must not make a NaN.
__device__ __forceinline__ float rescale_factor(float m_old, float m_new) {
  return ptx::exp2_approx(m_old - finite_or_zero(m_new));
}

// The owner's update of the reference max from its tile's row maxima (log2 units): alpha, the
// factor O and l are rescaled by, and m_ref, the finite reference P is exponentiated against.
// Lazy rescaling (config.h kLazyRescaleSlack): the reference moves to the tile's max only when that
// exceeds it by more than the slack, so most tiles keep alpha == 1 exactly and rescale_o skips O.
// -inf + slack is -inf: a row's first key always sets it.
__device__ __forceinline__ void move_reference(const float (&tile_max)[2], RowState& rs, float (&alpha)[2],
                                               float (&m_ref)[2]) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float m_new = tile_max[i] > rs.m[i] + kLazyRescaleSlack ? tile_max[i] : rs.m[i];
    alpha[i] = rescale_factor(rs.m[i], m_new);
    m_ref[i] = finite_or_zero(m_new);
    rs.m[i] = m_new;
  }
}

// O *= alpha per row: o is a (64, 256) wgmma accumulator fragment (wgmma.cuh layout, row i of the
// thread at o[4 j + 2 i + e]).
__device__ __forceinline__ void rescale_o(float (&o)[128], const float (&alpha)[2]) {
  // Lazy: most tiles do not move the max of any row of a warp (alpha == 1 exactly), and the 128
  // multiplications are the largest CUDA-core cost of a tile. The vote keeps the branch warp-uniform.
  if (__all_sync(0xffffffff, alpha[0] == 1.f && alpha[1] == 1.f)) return;
#pragma unroll
  for (int k = 0; k < 128; ++k) o[k] *= alpha[(k >> 1) & 1];
}

}  // namespace jax_mla::sm90
