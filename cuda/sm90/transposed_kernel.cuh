// The SM90 decode kernel's transposed shape, for requests of at most 16 query rows (DeepSeek-V3 at
// TP 8: h_q = 16, s_q = 1), opt-in with JAX_MLA_SM90_NARROW=transposed (or transposed_pipelined,
// transposed_splitk: kPipelined, kSplitK below). See config.h (TransposedShapeT) for the idea; the producer is
// decode_kernel.cuh's, on a box ring of 25 slots (23 with kSplitK).
//
// Per consumer c (warpgroup 1 + c) and every tile, all in wgmma m64n16k16 with both operands in
// shared memory (accumulator layout: wgmma.cuh; M index 16 w + l / 4 + 8 i, N index
// 8 j + 2 (l % 4) + e for register 4 j + 2 i + e):
//   S^T (64 keys, 16 rows)   = K (64 keys, 576) Q^T        36 wgmma, A = K boxes (K-major), B = Q boxes (K-major)
//   then release the boxes only S^T reads: the RoPE box and the other consumer's four V boxes;
//   mask, running max per query row: over the thread's 2 keys, the 8 lanes of a column (xor 4, 8,
//   16), then the 4 warps through smem (reduce[c], one 128-thread barrier);
//   P^T = exp2(S^T * scale_log2 - m) -> P (16 rows, 64 keys) into this consumer's P buffer,
//   K-major with the 128-byte swizzle (the layout of a TMA box), 16-bit;
//   O^T (256, 16) = alpha O^T + V^T P^T over its V boxes 4c .. 4c + 3 (value columns
//   256c .. 256c + 255)                                      16 wgmma, A = a V box (MN-major: a box
//   is 64 key rows of 64 value columns, so M = value columns is the contiguous dimension), B = P
//   (K-major); then release its V boxes.
// Both consumers compute the same S^T from the same bytes with the same instructions, so their
// softmax state (m, l) is bit-identical and neither needs the other's: they meet only on a
// request's last tile (kBarTScores), where each zeroes the dead V rows of its own boxes once both
// S^T, which read those rows as K, completed. Each writes its own 256 output columns; consumer 0
// also the LSE. (kSplitK: each computes half of S^T and they meet on every tile; see
// consumer_t_main.)
//
// History: the first version (2026-12-05, tenth session) gave each consumer whole tiles (tile g to
// consumer g % 2) on a two-tile ring and merged the two O^T through smem at the end of each piece;
// each consumer was then a one-stage pipeline (its tile's slots reloaded only after its own P V),
// and b64/h16 ran at 191-193 us on an H200 against 178-184 for the wide shape.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>
#include <cuda.h>
#include <cuda_runtime.h>

#include "decode_kernel.cuh"
#include "transposed_layout.h"

namespace jax_mla::sm90 {

// This thread's coordinates in the m64n16 accumulators (transposed_layout.h).
struct TCoords {
  int warp, lane;
  int m0;      // M index of slot i = 0 (i = 1: m0 + 8): the key in S^T, the column in a block of O^T
  int row[4];  // query row of slot q
  __device__ __forceinline__ explicit TCoords(int thread_in_wg) {
    warp = thread_in_wg / 32;
    lane = thread_in_wg % 32;
    m0 = t_m0(thread_in_wg);
#pragma unroll
    for (int q = 0; q < 4; ++q) row[q] = t_row(thread_in_wg, q);
  }
};

// Max (kSum false) or sum (true) over the 8 lanes that hold the same query rows (lane % 4 equal).
template <bool kSum>
__device__ __forceinline__ float column_reduce(float x) {
#pragma unroll
  for (int d = 4; d < 32; d <<= 1) {
    const float y = __shfl_xor_sync(0xffffffff, x, d);
    x = kSum ? x + y : fmaxf(x, y);
  }
  return x;
}

// The same over the consumer's four warps, through scratch (4 warps, 16 rows) and one barrier of
// the consumer's 128 threads. The caller keeps the next write to the same scratch behind a later
// barrier that all four warps pass only after these reads.
template <bool kSum>
__device__ __forceinline__ void warps_reduce(float (*scratch)[kTRows], int barrier, const TCoords& tc, float (&x)[4]) {
#pragma unroll
  for (int q = 0; q < 4; ++q) x[q] = column_reduce<kSum>(x[q]);
  if (tc.lane < 4) {
#pragma unroll
    for (int q = 0; q < 4; ++q) scratch[tc.warp][tc.row[q]] = x[q];
  }
  ptx::named_barrier_sync(barrier, 128);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    float r = scratch[0][tc.row[q]];
#pragma unroll
    for (int w = 1; w < 4; ++w) {
      const float y = scratch[w][tc.row[q]];
      r = kSum ? r + y : fmaxf(r, y);
    }
    x[q] = r;
  }
}

// S^T of tile t into st over the k-steps [kStep0, kStep1) of 16 columns (36 in all: 4 per box),
// waiting on each box as it lands; one wgmma group. The whole S^T is [0, 36); kSplitK gives each
// consumer half of it.
template <int kStep0, int kStep1, typename Storage, typename Shape>
__device__ __forceinline__ void issue_scores_t(Storage& s, const BoxRingConsumer<Shape::kNumSlots>& kv,
                                               const TileCursor<Shape>& t, float (&st)[kTRegsS]) {
  using Element = std::remove_reference_t<decltype(s.q[0][0])>;
  constexpr int kStepsPerBox = kKvBoxCols / 16;
  static_assert(0 <= kStep0 && kStep0 < kStep1 && kStep1 <= kKvBoxesQK * kStepsPerBox);
  const uint32_t q_base = ptx::smem_addr(&s.q[0][0]);
  wgmma_fence();
#pragma unroll
  for (int step = kStep0; step < kStep1; ++step) {
    const int box = step / kStepsPerBox, kk = step % kStepsPerBox;
    if (step == kStep0 || kk == 0) kv.wait_box(t.slots, box);
    const uint32_t k_box = ptx::smem_addr(&s.kv[t.slots.slot(box)][0]);
    const uint32_t q_box = q_base + box * Shape::kQBoxElems * 2;
    wgmma_m64n16k16_ss<Element, false, 0>(st, desc_k_major(k_box + kk * 32), desc_k_major(q_box + kk * 32),
                                          step != kStep0);
  }
  wgmma_commit();
}

// The S^T this consumer issues: all 36 k-steps, or (kSplitK) its half of them.
template <bool kSplitK, typename Storage, typename Shape>
__device__ __forceinline__ void issue_scores_part(Storage& s, const BoxRingConsumer<Shape::kNumSlots>& kv,
                                                  const TileCursor<Shape>& t, int consumer, float (&st)[kTRegsS]) {
  constexpr int kSteps = kKvBoxesQK * kKvBoxCols / 16;  // 36
  if constexpr (!kSplitK) {
    issue_scores_t<0, kSteps>(s, kv, t, st);
  } else if (consumer == 0) {
    issue_scores_t<0, kSteps / 2>(s, kv, t, st);
  } else {
    issue_scores_t<kSteps / 2, kSteps>(s, kv, t, st);
  }
}

// O^T[64 mb .. 64 mb + 64) (of this consumer's 256 columns) += V box^T P^T over the tile's 64 keys
// (4 k-steps of 16 keys).
template <typename Element, int kMb>
__device__ __forceinline__ void pv_block_t(float (&o)[kTRegsO], uint32_t v_box, uint32_t p_buf) {
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) {
    // A: keys 16 kk .. 16 kk + 15 are 16 rows of 128 bytes further (MN-major); B: 32 bytes further
    // along P's 128-byte rows (K-major).
    wgmma_m64n16k16_ss<Element, true, 8 * kMb>(o, desc_mn_major(v_box + kk * 16 * 128, kKvBoxBytes),
                                                desc_k_major(p_buf + kk * 32), 1);
  }
}

// This consumer's P V: its four V boxes (slots of a box ring need not be consecutive).
template <typename Storage, typename Shape>
__device__ __forceinline__ void issue_pv_t(Storage& s, const TileCursor<Shape>& t, int consumer, uint32_t p_buf,
                                           float (&o)[kTRegsO]) {
  using Element = std::remove_reference_t<decltype(s.q[0][0])>;
  const int b0 = v_box0(consumer);
  fence_operands(o);
  wgmma_fence();
  pv_block_t<Element, 0>(o, ptx::smem_addr(&s.kv[t.slots.slot(b0 + 0)][0]), p_buf);
  pv_block_t<Element, 1>(o, ptx::smem_addr(&s.kv[t.slots.slot(b0 + 1)][0]), p_buf);
  pv_block_t<Element, 2>(o, ptx::smem_addr(&s.kv[t.slots.slot(b0 + 2)][0]), p_buf);
  pv_block_t<Element, 3>(o, ptx::smem_addr(&s.kv[t.slots.slot(b0 + 3)][0]), p_buf);
  wgmma_commit();
}
static_assert(kVBoxesPerConsumer == 4, "issue_pv_t names a consumer's four V boxes");
static_assert(!kWholeTileRing<TransposedShapeT<false>::kNumSlots> && !kWholeTileRing<TransposedShapeT<true>::kNumSlots>,
              "the transposed shape releases box by box");
static_assert(TransposedShapeT<true>::kNumSlots >= 2 * kKvBoxesQK, "kPipelined reads two tiles at once (S^T of the next)");

// kPipelined (JAX_MLA_SM90_NARROW=transposed_pipelined): S^T of the piece's next tile is issued right
// behind this tile's P V, as its own wgmma group, so the tensor pipe runs it while the consumer waits
// for the P V (wgmma_wait<1>) instead of idling between the two; the next tile's softmax then starts
// on a finished S^T. Without it each tile runs S^T, softmax, P V strictly in turn.
//
// kSplitK (JAX_MLA_SM90_NARROW=transposed_splitk, always pipelined): each consumer issues half of
// S^T's k-steps; after its wgmma wait it writes its partial into xchg[tile parity][consumer], both
// meet at kBarTScores (every tile), and each adds the other's partial (a commutative fp32 add, so
// both hold the same bits). The double buffer: a consumer writes xchg[parity][c] again two tiles later, after
// the next tile's kBarTScores, which the other passes only after its read of this one.
template <typename Element, bool kPipelined, bool kSplitK>
__device__ __forceinline__ void consumer_t_main(TransposedStorage<Element, kSplitK>& s, const DecodeParams& p,
                                                const int32_t* part_info, const int32_t* split_offsets,
                                                int m_block, int consumer) {
  using Shape = TransposedShapeT<kSplitK>;
  const int thread = threadIdx.x % 128;
  const TCoords tc(thread);
  const BoxRingConsumer<Shape::kNumSlots> kv{&s.kv_bars, 1, false};
  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;
  const bool elected = thread == 0;
  uint8_t* p_bytes = reinterpret_cast<uint8_t*>(&s.p[consumer][0]);
  const uint32_t p_buf = ptx::smem_addr(p_bytes);
  const int row_base = m_block * kTRows;  // this CTA's 16 query rows of each request: row_base + 0..15
  const int rows_valid = min(kTRows, p.rows - row_base);
  const int other_v0 = v_box0(consumer ^ 1);
  TileCursor<Shape> st;  // ring position of the CTA's next tile (both consumers read every tile)
  int piece_count = 0;
  int tile_count = 0;  // kSplitK: tiles done by the CTA (xchg parity)

  for (int r = part_info[kPartBeginReq]; r <= part_info[kPartEndReq]; ++r) {
    const PieceOfWork w = piece_of(part_info, split_offsets, p.seq_lens, r);
    if (w.begin_block >= w.end_block) continue;
    const int seq_len = p.seq_lens[r];
    int visible[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int row = row_base + tc.row[q];
      visible[q] = row < p.rows ? visible_keys(seq_len, p.seq_q, row / p.heads_q, p.causal) : 0;
    }

    float o[kTRegsO];
    zero_accumulator(o);
    float m[4], l[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      m[q] = -INFINITY;
      l[q] = 0.f;
    }
    ptx::mbarrier_wait(&s.q_full, piece_count & 1);

    float sc[kTRegsS];  // S^T of the current tile (kPipelined: in flight from the previous iteration on)
    if constexpr (kPipelined) issue_scores_part<kSplitK>(s, kv, st, consumer, sc);
#pragma unroll 1
    for (int blk = w.begin_block; blk < w.end_block; ++blk, st.advance(), ++tile_count) {
      const int first_token = blk * kBlockN;
      if constexpr (!kPipelined) issue_scores_part<kSplitK>(s, kv, st, consumer, sc);
      wgmma_wait<0>();
      fence_operands(sc);
      if constexpr (kSplitK) {
        float4 (*mine)[128] = s.xchg[tile_count & 1][consumer];
        const float4 (*other)[128] = s.xchg[tile_count & 1][consumer ^ 1];
#pragma unroll
        for (int k = 0; k < kTRegsS; k += 4) mine[k / 4][thread] = make_float4(sc[k], sc[k + 1], sc[k + 2], sc[k + 3]);
        // Both partial S^T completed (each consumer waited for its own before arriving): the boxes
        // S^T read are free of it, and the dead V rows below may be zeroed without another barrier.
        ptx::named_barrier_sync(kBarTScores, kConsumerThreads);
#pragma unroll
        for (int k = 0; k < kTRegsS; k += 4) {
          const float4 x = other[k / 4][thread];
          // IEEE addition is commutative: mine + other is the same bits in both consumers.
          sc[k] += x.x;
          sc[k + 1] += x.y;
          sc[k + 2] += x.z;
          sc[k + 3] += x.w;
        }
      }
      // The boxes only S^T reads: this consumer is done with them (the other's release follows its
      // own S^T, and its V boxes' second release its P V).
      if (elected) {
        kv.template release_boxes<kVBoxesPerConsumer>(st.slots, other_v0);
        kv.template release_boxes<1>(st.slots, kKvRopeBox);
      }

      // Mask (select: masked K rows may hold anything, NaN included), then the tile's row max.
      float tile_max[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          if (first_token + tc.m0 + 8 * i >= visible[q]) sc[t_acc(i, q)] = -INFINITY;
        }
        tile_max[q] = fmaxf(sc[t_acc(0, q)], sc[t_acc(1, q)]);
      }
      // reduce[consumer]: its next write (the next tile's max) comes after this tile's P barrier below.
      warps_reduce<false>(s.reduce[consumer], kBarTReduce + consumer, tc, tile_max);
      float alpha[4], m_ref[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float m_new = fmaxf(m[q], tile_max[q] * scale_log2);
        alpha[q] = rescale_factor(m[q], m_new);
        m_ref[q] = finite_or_zero(m_new);
        m[q] = m_new;
      }
      // P into this consumer's buffer (its previous P V completed at the end of its previous tile).
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        float sum = 0.f;
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const float x = ptx::exp2_approx(fmaf(sc[t_acc(i, q)], scale_log2, -m_ref[q]));
          sum += x;
          *reinterpret_cast<Element*>(p_bytes + p_offset(tc.row[q], tc.m0 + 8 * i)) = to_element<Element>(x);
        }
        l[q] = l[q] * alpha[q] + sum;
      }
      // The tile's V rows past seq_len (inside the last page; P is 0 there, but 0 * NaN is NaN):
      // this consumer zeroes them in its own V boxes once both consumers' S^T, which read them as
      // K, completed. The condition is the same in both consumers (same tile, same seq_len).
      if (first_token + kBlockN > seq_len) {
        if constexpr (!kSplitK) ptx::named_barrier_sync(kBarTScores, kConsumerThreads);  // kSplitK: met above
        zero_dead_v_rows<kVBoxesPerConsumer>(s, st, v_box0(consumer), seq_len - first_token, thread);
      }
      ptx::fence_proxy_async_smem();  // P and the zeroed rows, before the async proxy (wgmma) reads them
      ptx::named_barrier_sync(kBarTReduce + consumer, 128);

      // Lazy rescale: skipped when no row of the warp moved its max (the vote keeps it warp-uniform).
      if (!__all_sync(0xffffffff, alpha[0] == 1.f && alpha[1] == 1.f && alpha[2] == 1.f && alpha[3] == 1.f)) {
#pragma unroll
        for (int k = 0; k < kTRegsO; ++k) o[k] *= alpha[t_slot_of(k)];
      }
      issue_pv_t(s, st, consumer, p_buf, o);
      if (kPipelined && blk + 1 < w.end_block) {
        // sc is free: this tile's scores went into P and the row state above. The next tile's boxes
        // land without this tile's release (the ring holds 25 slots, two tiles 18).
        issue_scores_part<kSplitK>(s, kv, st.next(), consumer, sc);
        wgmma_wait<1>();  // the P V (the older group) completed
      } else {
        wgmma_wait<0>();
      }
      fence_operands(o);
      if (elected) kv.template release_boxes<kVBoxesPerConsumer>(st.slots, v_box0(consumer));
    }
    if (elected) ptx::mbarrier_arrive(&s.q_empty);  // Q is no longer read by this consumer

    // Epilogue: full row sums over this consumer's lanes and warps (the same in both consumers).
    // sum_reduce[consumer] is next written at the next piece's end, after that piece's tile
    // barriers, which all four warps pass only after these reads.
    warps_reduce<true>(s.sum_reduce[consumer], kBarTReduce + consumer, tc, l);
    const int parity = piece_count & 1;
    const bool bad = s.bad_request[parity] != 0;
    RowResult res[2];
    {
      const float m01[2] = {m[0], m[1]}, m23[2] = {m[2], m[3]};
      const float l01[2] = {l[0], l[1]}, l23[2] = {l[2], l[3]};
      res[0] = finish_rows(m01, l01, bad);
      res[1] = finish_rows(m23, l23, bad);
    }
    const int64_t row0 = static_cast<int64_t>(r) * p.rows + row_base;
    const bool direct = w.num_splits == 1;
    const int64_t prow0 = static_cast<int64_t>(w.slot) * p.rows + row_base;
    const int col0 = consumer * kColsPerConsumer;
#pragma unroll
    for (int k = 0; k < kTRegsO; ++k) {
      const int mb = k / 8, i = t_mslot_of(k), q = t_slot_of(k);
      const int row = tc.row[q];
      if (row >= rows_valid) continue;
      const int col = col0 + 64 * mb + tc.m0 + 8 * i;
      const float v = o[k] * res[q >> 1].inv_sum[q & 1];
      if (direct) {
        static_cast<Element*>(p.out)[(row0 + row) * kHeadDimV + col] = to_element<Element>(v);
      } else {
        p.partial_out[(prow0 + row) * kHeadDimV + col] = v;
      }
    }
    if (consumer == 0 && tc.warp == 0 && tc.lane < 4) {
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int row = tc.row[q];
        if (row >= rows_valid) continue;
        const float lse = res[q >> 1].lse[q & 1];
        if (direct) {
          p.lse[row0 + row] = lse;
        } else {
          p.partial_lse[prow0 + row] = lse;
        }
      }
    }
    ++piece_count;
  }
}

template <typename Element, bool kPipelined, bool kSplitK>
__global__ void __launch_bounds__(kThreads, 1)
    decode_kernel_t(const __grid_constant__ DecodeParams p, const __grid_constant__ CUtensorMap q_map,
                    const __grid_constant__ CUtensorMap kv_map, const __grid_constant__ CUtensorMap kv_group_map) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(kPipelined || !kSplitK, "the split-K variant is built pipelined only");
  extern __shared__ uint8_t smem_raw[];
  auto& s = *reinterpret_cast<TransposedStorage<Element, kSplitK>*>(ptx::align_dynamic_smem<1024>(smem_raw));
  // The box ring loads one copy per box (grouped copies are for whole-tile rings): kv_group_map is unused.
  (void)kv_group_map;
  if (threadIdx.x == 0) {
    ptx::prefetch_tensor_map(&q_map);
    ptx::prefetch_tensor_map(&kv_map);
    s.kv_bars.init(kNumConsumers, 1, kNumConsumers);  // each box is released once by each consumer
    ptx::mbarrier_init(&s.q_full, 1);
    ptx::mbarrier_init(&s.q_empty, kNumConsumers);
    ptx::fence_barrier_init();
  }
  __syncthreads();
  ptx::grid_dependency_wait();
  ptx::grid_launch_dependents();

  // One row block of at most 16 rows (launch_t).
  const CtaWork work(p);
  const int warpgroup = __shfl_sync(0xffffffff, static_cast<int>(threadIdx.x / 128), 0);
  if (warpgroup == 0) {
    ptx::setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == 0) {
      producer_main<Element, TransposedShapeT<kSplitK>>(s, p, &q_map, &kv_map, nullptr, work.part_info,
                                                        work.split_offsets, work.m_block, 0, 1);
    }
    __syncwarp();
  } else {
    ptx::setmaxnreg_inc<kConsumerRegs>();
    consumer_t_main<Element, kPipelined, kSplitK>(s, p, work.part_info, work.split_offsets, work.m_block,
                                                  warpgroup - 1);
  }
#endif
}

}  // namespace jax_mla::sm90
