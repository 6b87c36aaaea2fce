// The consumer's tensor-core work: Q fragments, Q K^T of a sub-tile, the sum of a row group's
// partial scores, and P V. Warp (rg, wq) of config.h; g = lane / 4, t = lane % 4 (mma.cuh layouts).
#pragma once

#include <cstdint>

#include "../common/config.h"
#include "../common/problem.h"
#include "../common/ptx.cuh"
#include "config.h"
#include "mma.cuh"

namespace jax_mla::portable {

// This warp's Q: rows [16 rg, 16 rg + 16) of the CTA's 32, k-steps {4 b + wq : b = 0..8}, as mma A
// fragments. qf[b] covers columns [64 b + 16 wq, 64 b + 16 wq + 16), the columns this warp reads
// from box b of every sub-tile.
using QFragments = uint32_t[kKStepsPerWarp][4];
// Scores of 16 rows x 32 keys in accumulator layout: s[j] is key n-tile j (keys 8 j .. 8 j + 7).
using ScoreTile = float[kKeyTiles][4];
// O of 16 rows x 128 columns (columns 128 wq + 8 n + 2t, +1 in o[n]).
using OTile = float[kOTiles][4];

// Loads qf from global memory once per piece of work. row0 is this warp's first row in (b * rows)
// and rows_left the rows that exist from row0 on (padding rows of the last row block read as 0).
template <typename Element>
__device__ __forceinline__ void load_q(const DecodeProblem& p, int64_t row0, int rows_left, int wq, int lane,
                                       QFragments& qf) {
  const int g = lane / 4, t = lane % 4;
  const Element* q = static_cast<const Element*>(p.q);  // (b * rows, 576)
  const Element* r0 = q + (row0 + g) * kHeadDimQK;
  const Element* r1 = r0 + 8 * kHeadDimQK;
  const bool v0 = g < rows_left, v1 = g + 8 < rows_left;
#pragma unroll
  for (int b = 0; b < kKStepsPerWarp; ++b) {
    const int k0 = b * kBoxCols + 16 * wq + 2 * t;
    qf[b][0] = v0 ? *reinterpret_cast<const uint32_t*>(r0 + k0) : 0u;
    qf[b][1] = v1 ? *reinterpret_cast<const uint32_t*>(r1 + k0) : 0u;
    qf[b][2] = v0 ? *reinterpret_cast<const uint32_t*>(r0 + k0 + 8) : 0u;
    qf[b][3] = v1 ? *reinterpret_cast<const uint32_t*>(r1 + k0 + 8) : 0u;
  }
}

// The functions below take the CTA's shared storage as Storage: SharedStorage (16-bit cache, two
// stages) or SharedStorageFp8 (FP8 cache, the dequantized sub-tile in stage 0); both have the same
// kv[stage] layout and partial_scores.

// Partial S = Q K^T over this warp's 9 k-steps, for all 32 keys of the sub-tile in `stage` (9 x 4 mma).
template <typename Element, typename Storage>
__device__ __forceinline__ void partial_scores(const Storage& s, int stage, const QFragments& qf,
                                               int wq, int lane, ScoreTile& sc) {
#pragma unroll
  for (int j = 0; j < kKeyTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) sc[j][e] = 0.f;
  // ldmatrix x4 of K (stored row = key): matrices (keys 0-7, k 0-7), (keys 0-7, k 8-15),
  // (keys 8-15, k 0-7), (keys 8-15, k 8-15) of a 16-key pair = B fragments of two key n-tiles.
  const int key_in_pair = (lane & 7) + ((lane >> 4) << 3);
  const int chunk = 2 * wq + ((lane >> 3) & 1);
  const uint32_t base = smem_addr(&s.kv[stage][0][0][0]);
#pragma unroll
  for (int b = 0; b < kBoxes; ++b) {
#pragma unroll
    for (int pair = 0; pair < kKeyTiles / 2; ++pair) {
      const int key = 16 * pair + key_in_pair;
      uint32_t k[4];
      ldmatrix_x4(base + b * kBoxBytes + key * 128 + ((chunk ^ (key & 7)) << 4), k);
      mma_m16n8k16<Element>(sc[2 * pair], qf[b], k[0], k[1]);
      mma_m16n8k16<Element>(sc[2 * pair + 1], qf[b], k[2], k[3]);
    }
  }
}

// Replaces this warp's partial scores by the row group's full scores: every warp publishes its
// partial, then sums the four in warp order, so the sum is deterministic and bit-identical in the
// four warps (which is what lets each of them run the same softmax). The caller's barriers order
// the previous sub-tile's reads of partial_scores before these writes.
template <typename Element, typename Storage>
__device__ __forceinline__ void sum_partial_scores(Storage& s, int rg, int wq, int lane,
                                                   ScoreTile& sc) {
#pragma unroll
  for (int j = 0; j < kKeyTiles; ++j) {
    s.partial_scores[rg][wq][j][lane] = make_float4(sc[j][0], sc[j][1], sc[j][2], sc[j][3]);
  }
  ptx::named_barrier_sync(kBarPartialScores + rg, 32 * kWarpsPerRowGroup);
#pragma unroll
  for (int j = 0; j < kKeyTiles; ++j) {
    float4 sum = s.partial_scores[rg][0][j][lane];
#pragma unroll
    for (int w = 1; w < kWarpsPerRowGroup; ++w) {
      const float4 v = s.partial_scores[rg][w][j][lane];
      sum.x += v.x;
      sum.y += v.y;
      sum.z += v.z;
      sum.w += v.w;
    }
    sc[j][0] = sum.x;
    sc[j][1] = sum.y;
    sc[j][2] = sum.z;
    sc[j][3] = sum.w;
  }
}

// O += P V for the sub-tile in `stage`: P (16 rows, 32 keys) as A fragments pa[kk] (keys 16 kk ..),
// V the warp's 128 columns = boxes 2 wq, 2 wq + 1 (2 x 16 mma).
template <typename Element, typename Storage>
__device__ __forceinline__ void accumulate_pv(const Storage& s, int stage,
                                              const uint32_t (&pa)[kTileKeys / 16][4], int wq, int lane, OTile& o) {
  const uint32_t base = smem_addr(&s.kv[stage][2 * wq][0][0]);
  // ldmatrix x4 .trans of V (stored row = key): matrices (keys 0-7, cols 0-7), (keys 8-15, cols 0-7),
  // (keys 0-7, cols 8-15), (keys 8-15, cols 8-15) = B fragments of two column n-tiles.
  const int key_in_step = lane & 15;
  const int chunk_hi = lane >> 4;
#pragma unroll
  for (int kk = 0; kk < kTileKeys / 16; ++kk) {
    const int key = 16 * kk + key_in_step;
#pragma unroll
    for (int pr = 0; pr < kOTiles / 2; ++pr) {
      const int box = pr / (kChunksPerBoxRow / 2);
      const int chunk = 2 * (pr % (kChunksPerBoxRow / 2)) + chunk_hi;
      uint32_t v[4];
      ldmatrix_x4_trans(base + box * kBoxBytes + key * 128 + ((chunk ^ (key & 7)) << 4), v);
      mma_m16n8k16<Element>(o[2 * pr], pa[kk], v[0], v[1]);
      mma_m16n8k16<Element>(o[2 * pr + 1], pa[kk], v[2], v[3]);
    }
  }
}

}  // namespace jax_mla::portable
