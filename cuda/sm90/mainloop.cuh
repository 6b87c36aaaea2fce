// SM90 role: the two consumer warpgroups' main loop, the "seesaw" protocol between them. Per piece
// of the CTA's part (work_iterator.h): wait for Q, run S = Q K^T, the online softmax (softmax.cuh)
// and O += P V over the piece's KV tiles, then the piece's epilogue (epilogue.cuh). See config.h for
// the CTA layout, decode_kernel.cuh for how the roles are put together.
//
// The CTA's KV tiles form one sequence g = 0, 1, 2, ... over all its pieces (the producer's ring
// order): tile g's boxes sit in the box ring (kv_producer.cuh) at slots 9 g .. 9 g + 8 (mod the
// 18 slots), and tile g is owned by consumer w = g % 2. Both consumers keep the same running row
// max m; consumer w accumulates O_w = O[:, 256 w : 256 w + 256] over every tile.
//   owner of tile g:     S = Q K_g^T (64, 64), K = 576 (36 wgmma m64n64k16, waits box by box);
//                        m_g = max(m_{g-1}, rowmax S); P = exp2(S * scale_log2 - m_g);
//                        P and m_g into smem (P in the tile's RoPE box, dead after S)  -> kBarPReady + w;
//                        O_w = alpha_g O_w + P V_g[:, w half]   (4 wgmma m64n256k16, P from registers)
//   other consumer:      waits kBarPReady + w, reads m_g, alpha_g = exp2(m_{g-1} - m_g);
//                        O_w = alpha_g O_w + P V_g[:, w half]   (4 wgmma m64n256k16, P from smem)
//                        issues box 0 of S of its own tile g + 1 behind it, waits for that P V
//                        (wgmma_wait<1>), releases its boxes of tile g, then issues S's other eight boxes.
// So each consumer's wgmma stream is S_g, PV_g (own), PV_{g+1} (other's), S_{g+2}, ... and while one
// consumer runs its softmax the tensor cores work on the other one's wgmmas. Each consumer hands
// back tile g as soon as its P V of the tile completed: the ring holds two whole tiles and tile g's
// position goes back once both consumers are done with it.
// Both consumers run the same code (roles follow from g), with warp-uniform branches only, which
// keeps ptxas from serialising wgmmas on paths it cannot prove warp-uniform.
#pragma once

#include <cmath>
#include <cstdint>

#include "../common/config.h"
#include "../common/kv_producer.cuh"
#include "../common/problem.h"
#include "../common/ptx.cuh"
#include "../common/work_iterator.h"
#include "config.h"
#include "epilogue.cuh"
#include "launch_plan.h"
#include "softmax.cuh"
#include "split_merge.cuh"
#include "wgmma.cuh"

namespace jax_mla::sm90 {

// A consumer's view of the ring position of the CTA's next tile, and who owns that tile.
struct TileCursor {
  TileSlots<kNumSlots> slots;
  int owner = 0;  // g % 2
  __device__ __forceinline__ void advance() {
    slots.advance();
    owner ^= 1;
  }
  __device__ __forceinline__ TileCursor next() const {
    TileCursor c = *this;
    c.advance();
    return c;
  }
};

template <typename Element>
__device__ __forceinline__ uint32_t slot_addr(SharedStorage<Element>& s, const TileCursor& t, int box) {
  return ptx::smem_addr(&s.kv[t.slots.slot(box)][0]);
}

// Issues the part of S = Q K^T for tile t that reads boxes [box_begin, box_end) as one wgmma
// group, waiting on each box as it lands; box_begin == 0 starts the accumulator at zero. The
// caller waits for the group(s).
template <typename Element, typename W>
__device__ __forceinline__ void issue_scores(SharedStorage<Element>& s, const BoxRingConsumer<kNumSlots, W>& kv,
                                             const TileCursor& t, ScoreFragment& sc,
                                             int box_begin = 0, int box_end = kKvBoxesQK) {
  const uint32_t q_base = ptx::smem_addr(&s.q[0][0]);
  wgmma_fence();
#pragma unroll
  for (int box = 0; box < kKvBoxesQK; ++box) {
    if (box < box_begin || box >= box_end) continue;
    kv.wait_box(t.slots, box);
    const uint32_t k_box = slot_addr(s, t, box);
    const uint32_t q_box = q_base + box * kQBoxElems * 2;
#pragma unroll
    for (int kk = 0; kk < kKvBoxCols / 16; ++kk) {
      // 16 columns = 32 bytes inside the swizzled row.
      wgmma_m64n64k16_ss<Element>(sc, desc_k_major(q_box + kk * 32), desc_k_major(k_box + kk * 32), box | kk);
    }
  }
  wgmma_commit();
}

// First V box of consumer w's 256 columns.
__device__ __forceinline__ int v_box0(int consumer) { return consumer * kVBoxesPerConsumer; }

// O_w += P V[:, 256 w : 256 w + 256] for tile t, A = P (64, 64) in registers (kPInRegs: the
// owner's own tile, pf) or from the tile's RoPE box (the other's tile). A consumer's four V boxes
// are in consecutive slots (whole tiles fill the ring): one m64n256k16 per 16 keys, B spanning the
// four boxes (LBO = box bytes).
template <typename Element, bool kPInRegs>
__device__ __forceinline__ void issue_pv(SharedStorage<Element>& s, const TileCursor& t, int consumer,
                                         const PFragment& pf, float (&o)[128]) {
  const int b0 = v_box0(consumer);
  const uint32_t p_base = slot_addr(s, t, kKvRopeBox);
  fence_operands(o);
  wgmma_fence();
  const uint32_t v_base = slot_addr(s, t, b0);
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) {
    const uint64_t desc_v = desc_mn_major(v_base + kk * 16 * 128, kKvBoxBytes);  // keys 16kk..16kk+15
    if constexpr (kPInRegs) {
      const uint32_t a[4] = {pf[4 * kk], pf[4 * kk + 1], pf[4 * kk + 2], pf[4 * kk + 3]};
      wgmma_m64n256k16_rs<Element>(o, a, desc_v, 1);
    } else {
      wgmma_m64n256k16_ss<Element>(o, desc_k_major(p_base + kk * 32), desc_v, 1);
    }
  }
  wgmma_commit();
}

// Zeroes rows [first, 64) of V boxes [box0, box0 + kBoxes) of tile t (128 threads): cache slots
// past seq_len inside the last page, which P multiplies by exactly 0 but which may hold NaN. Each
// consumer zeroes only the columns its own P V reads (its kVBoxesPerConsumer boxes).
template <int kBoxes, typename Element>
__device__ __forceinline__ void zero_dead_v_rows(SharedStorage<Element>& s, const TileCursor& t, int box0, int first,
                                                 int thread) {
  constexpr int kChunksPerRow = kBoxes * (kKvBoxCols * 2 / 16);  // 16-byte chunks of a row's boxes
  const int total = (kBlockN - first) * kChunksPerRow;
  for (int idx = thread; idx < total; idx += 128) {
    const int row = first + idx / kChunksPerRow;
    const int box = box0 + (idx % kChunksPerRow) / 8, chunk = idx % 8;
    uint8_t* dst = reinterpret_cast<uint8_t*>(&s.kv[t.slots.slot(box)][0]) + row * 128 + chunk * 16;
    *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
  }
}

// Where a tile sits in its request: which keys, whether it is the piece's first or last.
struct TileInfo {
  int first_token;     // key index of the tile's row 0
  int seq_len;
  bool first_of_piece;  // O and the row sums are still the zeros of zero_accumulator
};

// The owner's step for its tile t, whose scores sc are complete: mask, running max, P, publish P and
// m for the other consumer, then its own P V (left in flight).
template <typename Element>
__device__ __forceinline__ void owner_step(SharedStorage<Element>& s, const TileCursor& t,
                                           const RowCoords& rc, int consumer, const TileInfo& ti,
                                           const int (&visible)[2], int visible_min, float scale_log2,
                                           ScoreFragment& sc, PFragment& pf, RowState& rs, float (&o)[128]) {
  const int thread = threadIdx.x % 128;
  if (ti.first_token + kBlockN > visible_min) mask_scores(sc, rc, ti.first_token, visible);
  float tile_max[2];
  tile_row_max(sc, scale_log2, tile_max);
  float alpha[2], m_ref[2];
  move_reference(tile_max, rs, alpha, m_ref);
  if ((thread & 3) == 0) {
    s.row_max[consumer][rc.row[0]] = rs.m[0];
    s.row_max[consumer][rc.row[1]] = rs.m[1];
  }
  float tile_sum[2];
  exponentiate(sc, scale_log2, m_ref, tile_sum);
#pragma unroll
  for (int i = 0; i < 2; ++i) rs.l[i] = rs.l[i] * alpha[i] + tile_sum[i];
  pack_p<Element>(sc, pf);
  store_p(pf, rc, reinterpret_cast<uint8_t*>(&s.kv[t.slots.slot(kKvRopeBox)][0]));
  const bool last_tile = ti.first_token + kBlockN > ti.seq_len;
  if (last_tile) zero_dead_v_rows<kVBoxesPerConsumer>(s, t, v_box0(consumer), ti.seq_len - ti.first_token, thread);
  ptx::fence_proxy_async_smem();  // P and the zeroed rows, before async-proxy (wgmma) reads
  ptx::named_barrier_arrive(kBarPReady + consumer, kConsumerThreads);
  // Our own P V reads the V rows this consumer's threads just zeroed: all of them must be done.
  if (last_tile) ptx::named_barrier_sync(kBarConsumer + consumer, 128);
  // The piece's first tile: alpha is 0 (the reference came from -inf) and O is still zero, so the
  // rescale would multiply zeros; the vote in rescale_o cannot see that (alpha != 1).
  if (!ti.first_of_piece) rescale_o(o, alpha);
  issue_pv<Element, true>(s, t, consumer, pf, o);
}

// The other consumer's step for tile t: adopt the owner's running max, then its own half of P V
// from the P in smem (left in flight). Requires this consumer's earlier wgmmas on O to have
// completed.
template <typename Element>
__device__ __forceinline__ void other_step(SharedStorage<Element>& s, const TileCursor& t,
                                           const RowCoords& rc, int consumer, const TileInfo& ti, RowState& rs,
                                           const PFragment& pf, float (&o)[128]) {
  const int thread = threadIdx.x % 128;
  ptx::named_barrier_sync(kBarPReady + t.owner, kConsumerThreads);
  float alpha[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float m_new = s.row_max[t.owner][rc.row[i]];
    alpha[i] = rescale_factor(rs.m[i], m_new);
    rs.m[i] = m_new;
    rs.l[i] *= alpha[i];
  }
  if (ti.first_token + kBlockN > ti.seq_len) {
    zero_dead_v_rows<kVBoxesPerConsumer>(s, t, v_box0(consumer), ti.seq_len - ti.first_token, thread);
    ptx::fence_proxy_async_smem();
    ptx::named_barrier_sync(kBarConsumer + consumer, 128);
  }
  if (!ti.first_of_piece) rescale_o(o, alpha);  // as in owner_step: O is still zero
  issue_pv<Element, false>(s, t, consumer, pf, o);
}

// wd: the wait policy (common/watchdog.cuh); the watchdog instantiation never merges in the kernel.
// kNextScoresFirst: in the other consumer's step, whether S of the next tile starts (its first box,
// behind our P V) before we release our boxes of this tile, or only after the release. Starting it
// first keeps the tensor pipe going, but its first box must have landed, so the release of tile g
// then waits for tile g + 1's box 0. A 16-bit cache's box 0 lands by TMA while tile g is consumed;
// an FP8 cache's boxes complete together, once the dequantizing warps rewrote the whole of tile
// g + 1, and the raw bytes of tile g + 2 go into g's position only after that release: load and
// rewrite of consecutive tiles would run one after the other (false for the FP8 cache).
template <typename Element, bool kNextScoresFirst, typename W>
__device__ __forceinline__ void consumer_main(SharedStorage<Element>& s, const DecodeProblem& p, const LaunchPlan& plan,
                                              const PartWork& work, int m_block, int consumer, bool grouped_copies,
                                              const W& wd) {
  const int thread = threadIdx.x % 128;
  const RowCoords rc(thread);
  const BoxRingConsumer<kNumSlots, W> kv{&s.kv_bars, grouped_copies, wd};
  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;
  const bool elected = thread == 0;
  TileCursor st;  // ring position and owner of the CTA's next tile
  const int rows_valid = min(kBlockM, p.rows - m_block * kBlockM);
  const int merge_thread = consumer * 128 + thread;  // 0..255 over both consumers, warps aligned

  work.for_each_piece([&](const PieceOfWork& w, int ordinal) {
    const int seq_len = work.seq_len(w);

    int visible[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = m_block * kBlockM + rc.row[i];
      // Rows past the request's are read from the next request's Q (finite, never stored).
      visible[i] = row < p.rows ? visible_keys(seq_len, p.seq_q, row / p.heads_q, p.causal) : seq_len;
    }
    const int visible_min = min(visible[0], visible[1]);

    float o[128];
    zero_accumulator(o);
    RowState rs{{-INFINITY, -INFINITY}, {0.f, 0.f}};
    ScoreFragment sc;
    PFragment pf;

    wd.wait(&s.q_full, ordinal & 1);

    // Tiles of this piece, in order. The wgmma groups in flight when a step starts: for an owned
    // tile, our S of this tile; for the other's tile, our own P V of the previous tile. Our boxes of
    // the previous tile are released as soon as our last wgmma reading them has completed. (The
    // owner's `has_pending` case below is not reached, since the other-tile step releases before it
    // issues the next S; it keeps the release correct should S ever be issued first.)
    bool has_pending = false;  // our in-flight P V still reads our boxes of tile `pending`
    TileCursor pending;
    if (st.owner == consumer) {
      issue_scores(s, kv, st, sc);
    }
#pragma unroll 1
    for (int blk = w.begin_block; blk < w.end_block; ++blk) {
      const TileInfo ti{blk * kBlockN, seq_len, blk == w.begin_block};
      if (st.owner == consumer) {
        if (has_pending) {
          wgmma_wait<1>();  // the other's P V (older group) done; S may still run
          fence_operands(o);
          if (elected) kv.release_tile(pending.slots);
          has_pending = false;
        }
        wgmma_wait<0>();
        fence_operands(sc);
        owner_step<Element>(s, st, rc, consumer, ti, visible, visible_min, scale_log2, sc, pf, rs, o);
      } else {
        // Our own P V of the previous tile must be done before O is rescaled.
        wgmma_wait<0>();
        fence_operands(o);
        fence_operands(pf);  // P's registers stay live until their wgmma completed
        if (has_pending && elected) kv.release_tile(pending.slots);
        has_pending = false;
        other_step<Element>(s, st, rc, consumer, ti, rs, pf, o);
        if (blk + 1 < w.end_block) {
          // Hand our boxes of this tile back as soon as our P V of it completed, before waiting on
          // the next tile's later boxes: were the release left pending until after that S, the
          // release of tile g would wait for tile g + 1 to land, so the producer could start the load
          // of g + 2 only once g + 1 was in: one 72 KB load in flight per SM instead of two.
          // kNextScoresFirst: S of the next tile starts with its first box, queued behind this P V
          // as its own wgmma group, so the tensor pipe goes from the P V straight into S instead of
          // idling through the wait, the release and the first issue; the other eight boxes follow
          // the release.
          constexpr int first_boxes = kNextScoresFirst ? 1 : 0;
          if constexpr (kNextScoresFirst) issue_scores(s, kv, st.next(), sc, 0, first_boxes);
          wgmma_wait<first_boxes>();
          fence_operands(o);
          if (elected) kv.release_tile(st.slots);
          issue_scores(s, kv, st.next(), sc, first_boxes, kKvBoxesQK);
          st.advance();
          continue;
        }
      }
      has_pending = true;
      pending = st;
      st.advance();
    }
    wgmma_wait<0>();
    fence_operands(o);
    fence_operands(pf);
    if (elected) {
      if (has_pending) kv.release_tile(pending.slots);
      // Q is no longer read: let the producer load the next request's Q while we finish.
      ptx::mbarrier_arrive(&s.q_empty);
    }

    store_piece(s, p, plan, w, ordinal, m_block, rows_valid, consumer, rc, rs, o, merge_thread);
  });
  // After the last wgmma of the CTA: waiting and merging inside the piece loop would stall the next
  // piece, and ptxas serialises every wgmma of the kernel when global loads sit between them (C7520).
  if constexpr (!W::kEnabled) {
    if (plan.fused_merge) merge_split_pieces<Element>(p, plan, work, m_block, rows_valid, merge_thread);
  }
}

}  // namespace jax_mla::sm90
