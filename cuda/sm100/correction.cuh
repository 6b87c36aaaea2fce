// SM100 role: the correction warpgroup (warps 8-11), which also runs the epilogue. Thread (quarter
// q = warp % 4, lane l) owns row 32 (q % 2) + l of O and, in each O half, the 128 columns of column
// quarter q / 2 (TMEM lanes 32 q .., config.h): the same row as thread (q, l) of the softmax warpgroup.
//
// Per piece of n tiles:
//   arrive o_ready                      O is free: the previous piece's epilogue loads completed
//   for t in [1, n):
//     wait alpha_full (alpha_t of this row, from the softmax), wait o_full (P V_{t-1} complete)
//     if any row of the warp has alpha != 1: O *= alpha in TMEM (tcgen05.ld, scale, tcgen05.st)
//     wait::st, fence::before_thread_sync, arrive o_ready   (P V_t may accumulate)
//   epilogue: wait stats_full (row max, sums, bad flag), wait o_full (P V_{n-1} complete),
//             O / sum -> out or the split-KV partial, LSE.
// With lazy rescaling (softmax.cuh) alpha is 1 for most tiles, and a warp whose 32 rows all have
// alpha == 1 skips the TMEM round trip.
#pragma once

#include <cstdint>

#include "../common/problem.h"
#include "../common/ptx.cuh"
#include "../common/work_iterator.h"
#include "config.h"
#include "descriptors.h"
#include "epilogue.cuh"
#include "tcgen05.cuh"

namespace jax_mla::sm100 {

// O[row, this thread's 256 columns] *= alpha, 32 columns at a time.
__device__ __forceinline__ void rescale_o(uint32_t tmem, uint32_t lane_base, float alpha) {
#pragma unroll 1
  for (int c = 0; c < kTmemColsO; c += 32) {
    const uint32_t taddr = tmem_addr(tmem, lane_base, kTmemColO + c);
    uint32_t v[32];
    tc::ld_32x32b_x32_sync(taddr, v);
#pragma unroll
    for (int k = 0; k < 32; ++k) v[k] = __float_as_uint(__uint_as_float(v[k]) * alpha);
    tc::st_32x32b_x32(taddr, v);
  }
  tc::wait_st();
}

template <typename Element, typename W>
__device__ __forceinline__ void correction_main(SharedStorage<Element>& s, const DecodeProblem& p,
                                                const PartWork& work, int m_block, uint32_t tmem, const W& wd) {
  const int thread = threadIdx.x - kCorrectionWarp0 * 32;  // 0..127
  const int quarter = thread / 32;
  const int row = 32 * (quarter & 1) + (thread % 32);
  const int col_quarter = quarter >> 1;
  const uint32_t lane_base = 32 * quarter;
  const int rows_valid = min(kBM, p.rows - m_block * kBM);

  uint32_t ev = 0;       // rescale events so far (alpha slot ev % 2)
  uint32_t o_phase = 0;  // P V completions waited for so far, mod 2
  work.for_each_piece([&](const PieceOfWork& w, int piece_count) {
    const int n = w.end_block - w.begin_block;

    ptx::mbarrier_arrive(&s.o_ready);  // P V_0 of this piece overwrites O
#pragma unroll 1
    for (int t = 1; t < n; ++t) {
      wd.wait(&s.alpha_full[ev & 1], (ev >> 1) & 1);
      const float alpha = s.alpha[ev & 1][row];
      ++ev;
      wd.wait(&s.o_full, o_phase);  // P V_{t-1} complete
      o_phase ^= 1;
      tc::fence_after_thread_sync();
      if (__any_sync(0xffffffffu, alpha != 1.f)) rescale_o(tmem, lane_base, alpha);
      tc::fence_before_thread_sync();
      ptx::mbarrier_arrive(&s.o_ready);
    }

    // Epilogue.
    const int pp = piece_count & 1;
    wd.wait(&s.stats_full[pp], (piece_count >> 1) & 1);
    wd.wait(&s.o_full, o_phase);  // P V_{n-1} complete
    o_phase ^= 1;
    tc::fence_after_thread_sync();
    const RowResult res =
        finish_row(s.final_max[pp][row], s.final_sum[pp][0][row] + s.final_sum[pp][1][row], s.final_bad[pp] != 0);
    const bool writes_lse = col_quarter == 0 && row < rows_valid;
    if (w.num_splits == 1) {
      const int64_t row0 = static_cast<int64_t>(w.request) * p.rows + m_block * kBM;  // in (b * rows)
      store_o(tmem, lane_base, row, col_quarter, rows_valid, res.inv_sum,
              static_cast<Element*>(p.out) + row0 * kHeadDimV);
      if (writes_lse) p.lse[row0 + row] = res.lse;
    } else {
      const int64_t prow0 = static_cast<int64_t>(w.slot) * p.rows + m_block * kBM;  // in (slots * rows)
      store_o(tmem, lane_base, row, col_quarter, rows_valid, res.inv_sum, p.partial_out + prow0 * kHeadDimV);
      if (writes_lse) p.partial_lse[prow0 + row] = res.lse;
    }
    tc::fence_before_thread_sync();  // our TMEM loads are done before the next o_ready arrival
  });
}

}  // namespace jax_mla::sm100
