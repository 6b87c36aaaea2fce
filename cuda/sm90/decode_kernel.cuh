// The SM90 MLA decode kernel: roles, main loop and the pair protocol between the two consumers.
// See config.h for the CTA layout and docs/design.md for the semantics.
//
// Grid: (num_parts, num_m_blocks). CTA (p, mb) walks the pieces of work of part p of the split-KV
// schedule (cuda/common/scheduler.h) for query rows [64 mb, 64 mb + 64) of each request.
//
// Per 64-key KV tile (one stage of the ring), consumer c in {0, 1}:
//   1. waits for the tile's boxes and computes S_c = Q K[32c : 32c + 32]^T, (64, 32), K = 576
//      (36 wgmma m64n32k16, Q and K from smem);
//   2. masks keys past the row's visible length and publishes its row max  -> barrier kBarRowMax
//      (after it both consumers' Q K^T are complete, so the tile's RoPE box is dead);
//   3. both compute the same running max m, alpha and P_c = exp2(S_c * scale_log2 - m); c writes
//      P_c into its half of the RoPE box and zeroes its half of the V rows past seq_len (cache slots
//      that P multiplies by exactly 0 but which may hold NaN)               -> barrier kBarPReady;
//   4. O_c = alpha O_c + P V[:, 256c : 256c + 256] (4 wgmma m64n256k16, P and V from smem), then
//      releases the stage. The producer meanwhile fills the other stage with the next tile, and the
//      consumers issue Q K^T of the next tile right behind this P V (software pipelining).
// Both consumers run the same instruction stream (operands differ by address only), which keeps
// ptxas from serialising wgmmas on paths it cannot prove warp-uniform.
#pragma once

#include <cmath>
#include <cstdint>
#include <cuda.h>
#include <cuda_runtime.h>

#include "../common/config.h"
#include "../common/kv_producer.cuh"
#include "../common/params.h"
#include "../common/ptx.cuh"
#include "../common/scheduler.h"
#include "config.h"
#include "epilogue.cuh"
#include "softmax.cuh"
#include "wgmma.cuh"

namespace jax_mla::sm90 {

template <typename Element>
__device__ __forceinline__ void producer_main(SharedStorage<Element>& s, const DecodeParams& p,
                                              const CUtensorMap* q_map, const CUtensorMap* kv_map,
                                              const int32_t* part_info, const int32_t* split_offsets, int m_block) {
  DecodeKVProducer<Element, kNumKvStages> producer{&s.kv_bars, &s.kv[0][0][0], {}};
  const int log2_page = 31 - __clz(p.page_size);
  int piece_count = 0;
  for (int r = part_info[kPartBeginReq]; r <= part_info[kPartEndReq]; ++r) {
    const PieceOfWork w = piece_of(part_info, split_offsets, p.seq_lens, r);
    if (w.begin_block >= w.end_block) continue;
    const int parity = piece_count & 1;

    // Q of this request's row block; waits until both consumers finished the previous piece.
    ptx::mbarrier_wait(&s.q_empty, parity ^ 1);
    s.bad_request[parity] = 0;
    ptx::mbarrier_arrive_expect_tx(&s.q_full, kKvTileBytes);
    const int q_row = r * p.rows + m_block * kBlockM;
#pragma unroll 1
    for (int box = 0; box < kKvBoxesQK; ++box) {
      ptx::tma_load_2d(&s.q[box][0], q_map, &s.q_full, box * kKvBoxCols, q_row);
    }

    const PagedKV kv{kv_map,
                     p.block_table + static_cast<int64_t>(r) * p.max_pages,
                     p.seq_lens[r],
                     p.page_size,
                     log2_page,
                     p.num_pages,
                     p.max_pages,
                     p.num_pages * p.page_size};
#pragma unroll 1
    for (int blk = w.begin_block; blk < w.end_block; ++blk) {
      const auto source = producer.locate_tile(kv, blk * kBlockN);  // block-table reads overlap the wait
      producer.acquire();
      if (!source.ok) s.bad_request[parity] = 1;  // before the tile's arrivals: consumers see it
      producer.load_tile(kv, source);
      producer.commit_step();
    }
    ++piece_count;
  }
}

// Issues S_c = Q K[32c : 32c + 32]^T for one tile (all 9 boxes) as one wgmma group, waiting on
// each box as it lands. The caller waits for the group.
template <typename Element>
__device__ __forceinline__ void issue_scores(SharedStorage<Element>& s, const KVConsumer<kNumKvStages>& kv,
                                               const PipelineState<kNumKvStages>& st, int consumer, ScoreFragment& sc) {
  const uint32_t q_base = ptx::smem_addr(&s.q[0][0]);
  // This consumer's 32 keys are rows [32c, 32c + 32) of every box: 4 whole 8-row swizzle groups.
  const uint32_t k_base = ptx::smem_addr(&s.kv[st.stage][0][0]) + consumer * kKeysPerConsumer * 128;
  fence_operands(sc);
  wgmma_fence();
#pragma unroll
  for (int box = 0; box < kKvBoxesQK; ++box) {
    kv.wait_box(st, box);
#pragma unroll
    for (int kk = 0; kk < kKvBoxCols / 16; ++kk) {
      const uint32_t off = box * kKvBoxBytes + kk * 32;  // 16 columns = 32 bytes inside the swizzled row
      wgmma_m64n32k16_ss<Element>(sc, desc_k_major(q_base + off), desc_k_major(k_base + off), box | kk);
    }
  }
  wgmma_commit();
}

// O_c += P V[:, 256c : 256c + 256] for one tile, P (64, 64) and V from smem.
template <typename Element>
__device__ __forceinline__ void accumulate_pv(SharedStorage<Element>& s, int stage, int consumer, float (&o)[128]) {
  const uint32_t v_base = ptx::smem_addr(&s.kv[stage][consumer * (kKvBoxesV / kNumConsumers)][0]);
  const uint32_t p_base = ptx::smem_addr(&s.kv[stage][kKvRopeBox][0]);
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) {
    const uint64_t desc_v = desc_mn_major(v_base + kk * 16 * 128, kKvBoxBytes);  // keys 16kk..16kk+15
    wgmma_m64n256k16_ss<Element>(o, desc_k_major(p_base + kk * 32), desc_v, 1);
  }
}

// Zeroes V rows [first, last) of a stage: cache slots past seq_len inside the last page, which
// P multiplies by exactly 0 but which may hold NaN.
template <typename Element>
__device__ __forceinline__ void zero_dead_v_rows(SharedStorage<Element>& s, int stage, int first, int last, int thread) {
  const int chunks_per_row = kKvBoxesV * (kKvBoxCols * 2 / 16);  // 64 x 16 bytes
  const int total = (last - first) * chunks_per_row;
  for (int idx = thread; idx < total; idx += 128) {
    const int row = first + idx / chunks_per_row;
    const int box = (idx % chunks_per_row) / 8, chunk = idx % 8;
    uint8_t* dst = reinterpret_cast<uint8_t*>(&s.kv[stage][box][0]) + row * 128 + chunk * 16;
    *reinterpret_cast<uint4*>(dst) = make_uint4(0, 0, 0, 0);
  }
}

// Steps 2-3 for one consumer and one tile whose scores sc are complete: mask, shared row max,
// P into smem, alpha. Both consumers call it once per tile (the barriers inside are among all 256
// consumer threads).
template <typename Element>
__device__ __forceinline__ void softmax_finish(SharedStorage<Element>& s, const PipelineState<kNumKvStages>& st,
                                               const RowCoords& rc, int consumer, int tile_first_token, int seq_len,
                                               const int (&visible)[2], int visible_min, float scale_log2,
                                               ScoreFragment& sc, float (&m)[2], float (&l)[2], float (&alpha)[2]) {
  const int thread = threadIdx.x % 128;
  const int first_token = tile_first_token + consumer * kKeysPerConsumer;  // this consumer's keys
  if (first_token + kKeysPerConsumer > visible_min) mask_scores(sc, rc, first_token, visible);
  float half_max[2];
  tile_row_max(sc, scale_log2, half_max);
  if ((thread & 3) == 0) {
    s.row_max[consumer][rc.row[0]] = half_max[0];
    s.row_max[consumer][rc.row[1]] = half_max[1];
  }
  ptx::named_barrier_sync(kBarRowMax, kConsumerThreads);

  float m_ref[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float m_new = fmaxf(m[i], fmaxf(s.row_max[0][rc.row[i]], s.row_max[1][rc.row[i]]));
    m_ref[i] = finite_or_zero(m_new);
    alpha[i] = ptx::exp2_approx(m[i] - m_ref[i]);  // m = -inf -> 0 (O and l are 0 then anyway)
    m[i] = m_new;
  }
  float half_sum[2];
  exponentiate(sc, scale_log2, m_ref, half_sum);
#pragma unroll
  for (int i = 0; i < 2; ++i) l[i] = l[i] * alpha[i] + half_sum[i];
  store_p_half<Element>(sc, rc, consumer, reinterpret_cast<uint8_t*>(&s.kv[st.stage][kKvRopeBox][0]));
  if (tile_first_token + kBlockN > seq_len) {
    const int lo = consumer * kKeysPerConsumer, hi = lo + kKeysPerConsumer;  // this consumer's rows
    const int first_dead = max(lo, min(hi, seq_len - tile_first_token));
    zero_dead_v_rows(s, st.stage, first_dead, hi, thread);
  }
  ptx::fence_proxy_async_smem();
  ptx::named_barrier_sync(kBarPReady, kConsumerThreads);
}

__device__ __forceinline__ void rescale_o(float (&o)[128], const float (&alpha)[2]) {
#pragma unroll
  for (int k = 0; k < 128; ++k) o[k] *= alpha[(k >> 1) & 1];
}

template <typename Element>
__device__ __forceinline__ void consumer_main(SharedStorage<Element>& s, const DecodeParams& p,
                                              const int32_t* part_info, const int32_t* split_offsets, int m_block,
                                              int consumer) {
  const int thread = threadIdx.x % 128;
  const RowCoords rc(thread);
  const KVConsumer<kNumKvStages> kv{&s.kv_bars};
  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;
  const bool elected = thread == 0;
  PipelineState<kNumKvStages> st;
  int piece_count = 0;
  const int rows_valid = min(kBlockM, p.rows - m_block * kBlockM);

  for (int r = part_info[kPartBeginReq]; r <= part_info[kPartEndReq]; ++r) {
    const PieceOfWork w = piece_of(part_info, split_offsets, p.seq_lens, r);
    if (w.begin_block >= w.end_block) continue;
    const int seq_len = p.seq_lens[r];

    int visible[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = m_block * kBlockM + rc.row[i];
      visible[i] = row < p.rows ? visible_keys(seq_len, p.seq_q, row / p.heads_q, p.causal) : seq_len;
    }
    const int visible_min = min(visible[0], visible[1]);

    float o[128];
#pragma unroll
    for (int k = 0; k < 128; ++k) o[k] = 0.f;
    float m[2] = {-INFINITY, -INFINITY};
    float l[2] = {0.f, 0.f};  // this thread's partial row sums (quad-reduced at the end)

    ptx::mbarrier_wait(&s.q_full, piece_count & 1);

    // Software pipeline over the piece's tiles: P V of tile t and Q K^T of tile t+1 go to the
    // tensor cores back to back, so the softmax of t+1 is the only time they idle. The loop body
    // has no branch around a wgmma (the last tile's P V is peeled off below).
    ScoreFragment sc;
    float alpha[2];
    issue_scores(s, kv, st, consumer, sc);
    wgmma_wait<0>();
    fence_operands(sc);
    softmax_finish(s, st, rc, consumer, w.begin_block * kBlockN, seq_len, visible, visible_min, scale_log2, sc, m,
                   l, alpha);
#pragma unroll 1
    for (int blk = w.begin_block; blk + 1 < w.end_block; ++blk) {
      const PipelineState<kNumKvStages> st_next = st.next();
      rescale_o(o, alpha);
      fence_operands(o);
      wgmma_fence();
      accumulate_pv<Element>(s, st.stage, consumer, o);
      wgmma_commit();
      issue_scores(s, kv, st_next, consumer, sc);
      wgmma_wait<1>();  // P V of tile t done: its stage goes back to the producer
      fence_operands(o);
      if (elected) kv.release(st);
      wgmma_wait<0>();
      fence_operands(sc);
      softmax_finish(s, st_next, rc, consumer, (blk + 1) * kBlockN, seq_len, visible, visible_min, scale_log2, sc,
                     m, l, alpha);
      st = st_next;
    }
    rescale_o(o, alpha);
    fence_operands(o);
    wgmma_fence();
    accumulate_pv<Element>(s, st.stage, consumer, o);
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(o);
    if (elected) kv.release(st);
    st.advance();
    // Q is no longer read: let the producer load the next request's Q while we finish.
    if (elected) ptx::mbarrier_arrive(&s.q_empty);

    // Epilogue: full row sums over both consumers, normalise, store.
    float total[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float mine = quad_sum(l[i]);
      if ((thread & 3) == 0) s.row_sum[consumer][rc.row[i]] = mine;
    }
    ptx::named_barrier_sync(kBarRowSum, kConsumerThreads);
#pragma unroll
    for (int i = 0; i < 2; ++i) total[i] = s.row_sum[0][rc.row[i]] + s.row_sum[1][rc.row[i]];
    const bool bad = s.bad_request[piece_count & 1] != 0;
    const RowResult res = finish_rows(m, total, bad);

    const int64_t row0 = static_cast<int64_t>(r) * p.rows + m_block * kBlockM;  // in (b * rows)
    const int col0 = consumer * kColsPerConsumer;
    if (w.num_splits == 1) {
      store_o(o, res, rc, rows_valid, col0, static_cast<Element*>(p.out) + row0 * kHeadDimV);
      if (consumer == 0 && (thread & 3) == 0) {
#pragma unroll
        for (int i = 0; i < 2; ++i)
          if (rc.row[i] < rows_valid) p.lse[row0 + rc.row[i]] = res.lse[i];
      }
    } else {
      const int64_t prow0 = static_cast<int64_t>(w.slot) * p.rows + m_block * kBlockM;  // in (slots * rows)
      store_o(o, res, rc, rows_valid, col0, p.partial_out + prow0 * kHeadDimV);
      if (consumer == 0 && (thread & 3) == 0) {
#pragma unroll
        for (int i = 0; i < 2; ++i)
          if (rc.row[i] < rows_valid) p.partial_lse[prow0 + rc.row[i]] = res.lse[i];
      }
    }
    ++piece_count;
  }
}

template <typename Element>
__global__ void __launch_bounds__(kThreads, 1)
    decode_kernel(const __grid_constant__ DecodeParams p, const __grid_constant__ CUtensorMap q_map,
                  const __grid_constant__ CUtensorMap kv_map) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ uint8_t smem_raw[];
  auto& s = *reinterpret_cast<SharedStorage<Element>*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                                       ~uintptr_t(1023));
  if (threadIdx.x == 0) {
    ptx::prefetch_tensor_map(&q_map);
    ptx::prefetch_tensor_map(&kv_map);
    s.kv_bars.init(kNumConsumers);
    ptx::mbarrier_init(&s.q_full, 1);
    ptx::mbarrier_init(&s.q_empty, kNumConsumers);
    ptx::fence_barrier_init();
  }
  __syncthreads();
  // Everything below reads memory written by earlier kernels (the schedule, q, the cache).
  ptx::grid_dependency_wait();
  ptx::grid_launch_dependents();

  const int32_t* part_info = p.schedule + static_cast<int64_t>(blockIdx.x) * kPartFields;
  const int32_t* split_offsets = p.schedule + static_cast<int64_t>(p.num_parts) * kPartFields;
  // Warp-uniform by construction (a shuffle from lane 0), so branches on it are not divergent for
  // ptxas: wgmma in a branch it cannot prove uniform gets serialized.
  const int warpgroup = __shfl_sync(0xffffffff, static_cast<int>(threadIdx.x / 128), 0);
  if (warpgroup == 0) {
    ptx::setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == 0) producer_main(s, p, &q_map, &kv_map, part_info, split_offsets, blockIdx.y);
  } else {
    ptx::setmaxnreg_inc<kConsumerRegs>();
    consumer_main(s, p, part_info, split_offsets, blockIdx.y, warpgroup - 1);
  }
#endif
}

}  // namespace jax_mla::sm90
