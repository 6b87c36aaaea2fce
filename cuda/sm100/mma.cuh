// SM100 role: the MMA warp (one thread of warp 1 issues everything). Per piece of work (n tiles):
//
//   wait Q;  S_0 = Q K_0^T
//   for t in [0, n):
//     if tile t+1 has landed and its S slot is free: S_{t+1} = Q K_{t+1}^T     (early, see below)
//     wait P_t (softmax) and O ready (correction);  O += P_t V_t
//     commit -> kv empty[stage of t]   (the stage goes back to the producer once S_t and P V_t are done)
//     commit -> o_full                 (correction / epilogue may read O)
//     otherwise S_{t+1} now
//   (commit -> q_empty after the last S of the piece: the producer may load the next Q)
//
// S_{t+1} goes to the tensor core before P V_t only when its tile is already in shared memory, so
// that the tensor core works on it while the softmax computes P_t (the compute-bound case); when the
// tile is still in flight (the memory-bound case) P V_t goes first, so that stage t is released as
// early as possible and the producer can refill it while tile t+1 is still loading.
//
// Every S MMA: Q box b and K box b of the stage, 4 K-steps of 16 columns (+32 bytes inside the
// 128-byte swizzled rows), 36 per tile; the first overwrites the S slot. Every P V MMA: P (the stage's
// RoPE box, K-major) times V half h (boxes 4h .. 4h+3 of the stage, MN-major), K-step kk = keys
// [16 kk, 16 kk + 16) = +2048 bytes; the first of a piece overwrites O.
#pragma once

#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <type_traits>

#include "../common/kv_producer.cuh"
#include "../common/problem.h"
#include "../common/ptx.cuh"
#include "../common/work_iterator.h"
#include "config.h"
#include "descriptors.h"
#include "tcgen05.cuh"

namespace jax_mla::sm100 {

template <typename Element>
inline constexpr MmaInput kMmaInputOf = std::is_same_v<Element, __nv_bfloat16> ? MmaInput::kBF16 : MmaInput::kF16;

template <typename Element, typename W>
struct MmaIssuer {
  SharedStorage<Element>& s;
  KVConsumer<kNumKvStages, W> kv;  // kv.wd: the wait policy of every wait of the MMA warp
  uint32_t tmem;  // TMEM base (lane 0, column 0 of the allocation)

  static constexpr uint32_t kIdescQK = idesc_qk(kMmaInputOf<Element>);
  static constexpr uint32_t kIdescPV = idesc_pv(kMmaInputOf<Element>);

  // Whether every box of the tile in stage `st` has landed (non-blocking).
  __device__ __forceinline__ bool tile_landed(const PipelineState<kNumKvStages>& st) const {
    bool all = true;
#pragma unroll
    for (int box = 0; box < kKvBoxesQK; ++box) all &= ptx::mbarrier_test_wait(&s.kv_bars.full[st.stage][box], st.phase);
    return all;
  }

  // S slot of global tile g: g % 2; the softmax frees a slot once per use, so the MMA waits for the
  // previous use's release (parity of the use count, starting "released", like the producer).
  __device__ __forceinline__ bool slot_free_now(uint32_t g) const {
    return ptx::mbarrier_test_wait(&s.s_empty[g & 1], ((g >> 1) & 1) ^ 1);
  }

  // S_g = Q K^T for the tile in stage st, into S slot g % 2; commit -> s_full[g % 2].
  __device__ __forceinline__ void issue_qk(const PipelineState<kNumKvStages>& st, uint32_t g) const {
    const uint32_t slot = g & 1;
    kv.wd.wait(&s.s_empty[slot], ((g >> 1) & 1) ^ 1);
    tc::fence_after_thread_sync();  // the softmax's tcgen05.ld of this slot come before our writes
    const uint32_t d = tmem_addr(tmem, 0, kTmemColS + slot * kTmemColsS);
    const uint32_t q_base = ptx::smem_addr(&s.q[0][0]);
    const uint32_t k_base = ptx::smem_addr(&s.kv[st.stage][0][0]);
#pragma unroll 1
    for (int box = 0; box < kKvBoxesQK; ++box) {
      kv.wait_box(st, box);  // Q K^T starts on box 0 while later boxes are in flight
#pragma unroll
      for (int kk = 0; kk < kKvBoxCols / kMmaK; ++kk) {
        const uint32_t off = box * kKvBoxBytes + kk * (kMmaK * 2);
        tc::mma_ws_f16_ss(d, smem_desc_k_major_sw128(q_base + off), smem_desc_k_major_sw128(k_base + off), kIdescQK,
                          (box | kk) != 0);
      }
    }
    tc::commit(&s.s_full[slot]);
  }

  // O += P V for the tile in `stage` (P in its RoPE box). accumulate == false overwrites O.
  __device__ __forceinline__ void issue_pv(int stage, bool accumulate) const {
    const uint32_t p_base = ptx::smem_addr(&s.kv[stage][kKvRopeBox][0]);
    const uint32_t v_base = ptx::smem_addr(&s.kv[stage][0][0]);
#pragma unroll
    for (int kk = 0; kk < kBN / kMmaK; ++kk) {
      const uint64_t a = smem_desc_k_major_sw128(p_base + kk * (kMmaK * 2));
#pragma unroll
      for (int h = 0; h < kPvHalves; ++h) {
        // V[keys 16 kk .., columns 256 h ..]: boxes 4h.., 16 token rows of 128 bytes per K-step.
        const uint32_t v_addr = v_base + h * (kPvN / kKvBoxCols) * kKvBoxBytes + kk * kMmaK * (kKvBoxCols * 2);
        tc::mma_ws_f16_ss(tmem_addr(tmem, 0, kTmemColO + h * (kPvN / 2)), a,
                          smem_desc_mn_major_sw128(v_addr, kKvBoxBytes), kIdescPV, accumulate || kk > 0);
      }
    }
  }
};

template <typename Element, typename W>
__device__ __forceinline__ void mma_main(SharedStorage<Element>& s, const PartWork& work, uint32_t tmem, const W& wd) {
  const MmaIssuer<Element, W> mma{s, KVConsumer<kNumKvStages, W>{&s.kv_bars, wd}, tmem};
  PipelineState<kNumKvStages> st;  // this thread's view of the KV ring
  uint32_t g = 0;                  // tiles of this CTA so far (S / P slot g % 2)
  uint32_t o_phase = 0;            // uses of o_ready so far, mod 2
  work.for_each_piece([&](const PieceOfWork& w, int piece_count) {
    const int n = w.end_block - w.begin_block;

    wd.wait(&s.q_full, piece_count & 1);
    mma.issue_qk(st, g);
    if (n == 1) tc::commit(&s.q_empty);
#pragma unroll 1
    for (int t = 0; t < n; ++t) {
      const PipelineState<kNumKvStages> st_next = st.next();
      const bool has_next = t + 1 < n;
      bool next_issued = false;
      if (has_next && mma.tile_landed(st_next) && mma.slot_free_now(g + 1)) {
        mma.issue_qk(st_next, g + 1);
        next_issued = true;
      }
      wd.wait(&s.p_full[g & 1], (g >> 1) & 1);
      wd.wait(&s.o_ready, o_phase);
      o_phase ^= 1;
      tc::fence_after_thread_sync();  // the correction's tcgen05.st to O come before our MMAs
      mma.issue_pv(st.stage, t > 0);
      tc::commit(&s.kv_bars.empty[st.stage]);
      tc::commit(&s.o_full);
      if (has_next && !next_issued) mma.issue_qk(st_next, g + 1);
      if (t + 2 == n) tc::commit(&s.q_empty);  // S_{n-1} was issued above: the last reader of Q
      st = st_next;
      ++g;
    }
  });
}

}  // namespace jax_mla::sm100
