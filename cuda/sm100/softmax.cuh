// SM100 role: the softmax warpgroup (warps 4-7). Thread (quarter q = warp % 4, lane l) owns query row
// 32 (q % 2) + l and key half q / 2 (keys [32 (q / 2), + 32) of every tile): exactly the TMEM cells
// of an M = 64, N = 64 .ws accumulator its warp may read (lanes 32 q .. 32 q + 31, config.h).
//
// Per tile (global index g of this CTA, S / P slot g % 2):
//   1. wait s_full, tcgen05.ld the 32 scores (32x32b.x32), wait::ld, release the S slot (s_empty);
//   2. mask keys >= the row's visible length with a select to -inf (masked K rows may hold NaN);
//   3. row max: this half's max, exchanged with the other half through shared memory (one named
//      barrier), in log2 units (scale * log2(e) folded into one FMA);
//   4. lazy rescale: the reference max m_ref moves only when the tile's max exceeds it by more than
//      kRescaleThreshold; then alpha = exp2(m_ref_old - m_ref_new) (0 for the first visible key),
//      else alpha = 1. P = exp2(s * scale_log2 - m_ref) <= 2^8, the half row sum l = l * alpha + sum P;
//   5. wait the stage's full barriers (acquire: orders the TMA writes before ours, and makes the
//      producer's tile_bad flag visible), write P (16-bit, K-major, 128-byte swizzle: the layout of a
//      TMA box) into the stage's RoPE box, zero the V rows past seq_len (the tail tile only: cache
//      slots P multiplies by exactly 0 but which may hold NaN), fence.proxy.async (generic writes ->
//      tensor core reads), arrive p_full;
//   6. tiles after a piece's first: publish alpha for the correction warpgroup (alpha_full).
// After a piece's last tile: publish m_ref, both half sums and the bad flag (stats_full).
#pragma once

#include <cmath>
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <type_traits>

#include "../common/kv_producer.cuh"
#include "../common/problem.h"
#include "../common/ptx.cuh"
#include "../common/row_math.cuh"
#include "../common/work_iterator.h"
#include "config.h"
#include "descriptors.h"
#include "tcgen05.cuh"

namespace jax_mla::sm100 {

inline constexpr int kKeysPerThread = kBN / 2;  // 32: one key half of a row

// Writes P[row, 32 half .. 32 half + 31] into the (64 rows, 64 keys) 16-bit P box: rows of 128 bytes,
// 16-byte chunk c of row r stored at chunk c ^ (r % 8) (the 128-byte swizzle the TMA writes and the
// K-major smem descriptor of the P V MMA reads).
template <typename Element>
__device__ __forceinline__ void store_p(const float (&pv)[kKeysPerThread], int row, int half, uint8_t* box) {
#pragma unroll
  for (int c = 0; c < kKeysPerThread / 8; ++c) {
    const int chunk = half * (kKeysPerThread / 8) + c;
    uint4 v;
    v.x = pack2<Element>(pv[8 * c + 0], pv[8 * c + 1]);
    v.y = pack2<Element>(pv[8 * c + 2], pv[8 * c + 3]);
    v.z = pack2<Element>(pv[8 * c + 4], pv[8 * c + 5]);
    v.w = pack2<Element>(pv[8 * c + 6], pv[8 * c + 7]);
    *reinterpret_cast<uint4*>(box + row * 128 + ((chunk ^ (row & 7)) << 4)) = v;
  }
}

// Zeroes V rows [first, kBN) of a stage (boxes 0-7), spread over the 128 threads of the warpgroup.
template <typename Element>
__device__ __forceinline__ void zero_dead_v_rows(SharedStorage<Element>& s, int stage, int first, int thread) {
  constexpr int kChunksPerRow = kKvBoxesV * (kKvBoxCols * 2 / 16);  // 64 x 16 bytes
  const int total = (kBN - first) * kChunksPerRow;
  for (int idx = thread; idx < total; idx += kWarpgroupThreads) {
    const int row = first + idx / kChunksPerRow;
    const int box = (idx % kChunksPerRow) / 8, chunk = idx % 8;
    uint8_t* dst = reinterpret_cast<uint8_t*>(&s.kv[stage][box][0]) + row * 128 + chunk * 16;
    *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
  }
}

template <typename Element, typename W>
__device__ __forceinline__ void softmax_main(SharedStorage<Element>& s, const DecodeProblem& p, const PartWork& work,
                                             int m_block, uint32_t tmem, const W& wd) {
  const int thread = threadIdx.x - kSoftmaxWarp0 * 32;  // 0..127
  const int quarter = thread / 32;                      // == warp % 4: TMEM lanes 32 quarter ..
  const int row = 32 * (quarter & 1) + (thread % 32);
  const int half = quarter >> 1;
  const uint32_t lane_base = 32 * quarter;
  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;
  const KVConsumer<kNumKvStages, W> kv{&s.kv_bars, wd};
  const int q_row = m_block * kBM + row;  // row of the request's s_q * h_q rows

  PipelineState<kNumKvStages> st;
  uint32_t g = 0;   // tiles so far (S / P slot g % 2)
  uint32_t ev = 0;  // rescale events so far (tiles after a piece's first), alpha slot ev % 2
  work.for_each_piece([&](const PieceOfWork& w, int piece_count) {
    const int seq_len = work.seq_len(w);
    // Padding rows past p.rows are never stored; give them the full length (finite, harmless).
    const int visible = q_row < p.rows ? visible_keys(seq_len, p.seq_q, q_row / p.heads_q, p.causal) : seq_len;

    float m_ref = -INFINITY;  // log2 units; -inf until the row saw a visible key
    float l = 0.f;            // sum of this half's P against m_ref
    int bad = 0;
#pragma unroll 1
    for (int blk = w.begin_block; blk < w.end_block; ++blk) {
      const uint32_t slot = g & 1;
      const int first_token = blk * kBN;

      // 1. Scores from TMEM.
      wd.wait(&s.s_full[slot], (g >> 1) & 1);
      tc::fence_after_thread_sync();
      uint32_t raw[kKeysPerThread];
      tc::ld_32x32b_x32_sync(tmem_addr(tmem, lane_base, kTmemColS + slot * kTmemColsS), raw);
      tc::fence_before_thread_sync();
      ptx::mbarrier_arrive(&s.s_empty[slot]);
      float x[kKeysPerThread];
#pragma unroll
      for (int j = 0; j < kKeysPerThread; ++j) x[j] = __uint_as_float(raw[j]);

      // 2. Mask.
      const int key0 = first_token + half * kKeysPerThread;
      if (key0 + kKeysPerThread > visible) {
#pragma unroll
        for (int j = 0; j < kKeysPerThread; ++j) x[j] = key0 + j >= visible ? -INFINITY : x[j];
      }

      // 3. Row max over both halves.
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < kKeysPerThread; ++j) mx = fmaxf(mx, x[j]);
      mx *= scale_log2;
      s.row_max[g & 1][half][row] = mx;
      ptx::named_barrier_sync(kBarSoftmaxRowMax, kWarpgroupThreads);
      const float m_tile = fmaxf(mx, s.row_max[g & 1][half ^ 1][row]);

      // 4. Lazy rescale and exponentials.
      float alpha = 1.f;
      if (m_tile > m_ref + kRescaleThreshold) {  // false while m_tile = -inf (nothing visible yet)
        alpha = ptx::exp2_approx(m_ref - m_tile);  // m_ref = -inf -> 0 (O and l are 0 then anyway)
        m_ref = m_tile;
      }
      const float m_use = m_ref == -INFINITY ? 0.f : m_ref;  // finite, so -inf - m never makes a NaN
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kKeysPerThread; ++j) {
        x[j] = ptx::exp2_approx(fmaf(x[j], scale_log2, -m_use));
        sum += x[j];
      }
      l = l * alpha + sum;

      // 5. P into the stage's RoPE box (dead: S of this tile is complete), dead V rows zeroed.
#pragma unroll 1
      for (int box = 0; box < kKvBoxesQK; ++box) kv.wait_box(st, box);
      bad |= s.tile_bad[st.stage];
      store_p<Element>(x, row, half, reinterpret_cast<uint8_t*>(&s.kv[st.stage][kKvRopeBox][0]));
      if (first_token + kBN > seq_len) {
        zero_dead_v_rows(s, st.stage, max(0, seq_len - first_token), thread);
      }
      const bool rescale_event = blk > w.begin_block;
      if (rescale_event && half == 0) s.alpha[ev & 1][row] = alpha;
      ptx::fence_proxy_async_smem();
      ptx::mbarrier_arrive(&s.p_full[slot]);

      // 6. alpha for the correction warpgroup (one writer per row: the key-half-0 threads).
      if (rescale_event) {
        if (half == 0) ptx::mbarrier_arrive(&s.alpha_full[ev & 1]);
        ++ev;
      }
      st.advance();
      ++g;
    }

    // The piece's row statistics for the epilogue.
    const int pp = piece_count & 1;
    s.final_sum[pp][half][row] = l;
    if (half == 0) s.final_max[pp][row] = m_ref;
    if (thread == 0) s.final_bad[pp] = bad;
    ptx::mbarrier_arrive(&s.stats_full[pp]);
  });
}

}  // namespace jax_mla::sm100
