// The SM100 MLA decode kernel: setup, role dispatch, teardown. See config.h for the CTA layout and
// the TMEM / shared-memory plans, and each role's file for its part of the protocol:
//   producer.cuh    warp 0      Q and the KV ring by TMA (shared DecodeKVProducer); one-token pages
//                               of an FP8 cache gathered by the whole warp (cp.async)
//   fp8_tiles.cuh   warps 2-3   FP8 cache only: each tile's raw bytes rewritten as 16-bit boxes
//   mma.cuh         warp 1      tcgen05.mma for S = Q K^T and O += P V, tcgen05.commit
//   softmax.cuh     warps 4-7   S from TMEM, online softmax, P into shared memory
//   correction.cuh  warps 8-11  O rescaled in TMEM, epilogue (epilogue.cuh)
//
// Grid: (num_parts, num_m_blocks). CTA (p, mb) walks the pieces of work of part p of the split-KV
// schedule (cuda/common/work_iterator.h) for query rows [64 mb, 64 mb + 64) of each request; every
// role walks the same pieces independently and counts tiles the same way, so the slots and phases
// of every barrier agree without further communication.
//
// Barriers (shared memory; arrival counts in config.h's SharedStorage): each is used as a ring of
// one or two slots whose waiter, for use k, always passes its wait before use k + 1 can complete
// (checked role by role in docs/design.md), so parity waits are unambiguous.
//   kv full[stage][box]   TMA bytes          -> MMA (S), softmax (before it writes into the stage)
//                         (FP8: kDequantWarps arrivals, after fence.proxy.async, instead)
//   fp8.raw_full[stage]   TMA bytes of a raw FP8 tile -> dequantizing warps (FP8 only; gathered
//                         one-token pages: one cp.async arrival per producer lane, no bytes)
//   kv empty[stage]       commit after P V   -> producer
//   q_full / q_empty      TMA / commit after the piece's last S
//   s_full[2] / s_empty[2]  commit after S   -> softmax / 128 softmax arrivals -> MMA
//   p_full[2]             128 softmax arrivals (after fence.proxy.async) -> MMA (P V)
//   o_ready               128 correction arrivals (O rescaled, or free for a new piece) -> MMA (P V)
//   o_full                commit after P V   -> correction (rescale of the next tile, epilogue)
//   alpha_full[2]         64 softmax arrivals (one per row) -> correction
//   stats_full[2]         128 softmax arrivals at a piece's end -> epilogue
//
// kFormat: the cache's format. An FP8 cache (fp8_tiles.cuh) lands as raw bytes, and warps 2-3 turn
// it into the 16-bit boxes the other roles read; kv_map, kv_rope_map and kv_scale_map are then its
// byte, RoPE and scale views (launch.h). For a 16-bit cache the last two are unused.
//
// kWatchdog: the self-check's instantiation, whose every barrier wait gives up at a deadline
// (common/watchdog.cuh) so that a hang becomes a failed check; production instantiates false.
#pragma once

#include <cstdint>
#include <cuda.h>
#include <cuda_runtime.h>
#include <type_traits>

#include "../common/config.h"
#include "../common/kv_producer.cuh"
#include "../common/problem.h"
#include "../common/ptx.cuh"
#include "../common/watchdog.cuh"
#include "../common/work_iterator.h"
#include "config.h"
#include "correction.cuh"
#include "fp8_tiles.cuh"
#include "mma.cuh"
#include "producer.cuh"
#include "softmax.cuh"
#include "tcgen05.cuh"

// Real code only for the architectures with tcgen05 and TMEM (sm_100a: B200/GB200, sm_103a:
// B300/GB300, and their family-specific sm_100f / sm_103f forms); the build compiles every .cu for
// every architecture it targets, so elsewhere the kernel is an empty stub that is never launched.
#if defined(__CUDA_ARCH__) &&                                                          \
    (defined(__CUDA_ARCH_FEAT_SM100_ALL) || defined(__CUDA_ARCH_FEAT_SM103_ALL) ||    \
     (defined(__CUDA_ARCH_FAMILY_SPECIFIC__) &&                                        \
      (__CUDA_ARCH_FAMILY_SPECIFIC__ == 1000 || __CUDA_ARCH_FAMILY_SPECIFIC__ == 1030)))
#define JAX_MLA_SM100_DEVICE 1
#else
#define JAX_MLA_SM100_DEVICE 0
#endif

namespace jax_mla::sm100 {

template <typename Element, bool kWatchdog, KvFormat kFormat>
__global__ void __launch_bounds__(kThreads, 1)
    decode_kernel(const __grid_constant__ DecodeProblem p, const __grid_constant__ CUtensorMap q_map,
                  const __grid_constant__ CUtensorMap kv_map, const __grid_constant__ CUtensorMap kv_rope_map,
                  const __grid_constant__ CUtensorMap kv_scale_map, const __grid_constant__ WatchdogParams watchdog) {
#if JAX_MLA_SM100_DEVICE
  using W = std::conditional_t<kWatchdog, Watchdog, NoWatchdog>;
  const W wd = W::start(watchdog);
  extern __shared__ uint8_t smem_raw[];
  auto& s = *reinterpret_cast<SharedStorage<Element>*>(ptx::align_dynamic_smem<1024>(smem_raw));
  // Warp-uniform by construction (a shuffle from lane 0).
  const int warp = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 32), 0);
  const int lane = threadIdx.x % 32;
  constexpr bool kFp8 = kFormat == KvFormat::kFp8;
  // An FP8 cache of one-token pages (the sparse decode's view): warp 0 gathers it (producer.cuh).
  const bool gathered = kFp8 && p.page_size == 1;

  if (threadIdx.x == 0) {
    ptx::prefetch_tensor_map(&q_map);
    ptx::prefetch_tensor_map(&kv_map);
    if constexpr (kFp8) {
      ptx::prefetch_tensor_map(&kv_rope_map);
      ptx::prefetch_tensor_map(&kv_scale_map);
      for (int i = 0; i < kNumKvStages; ++i) ptx::mbarrier_init(&s.fp8.raw_full[i], gathered ? kGatherLanes : 1);
    }
    // FP8: a box is complete after one arrival per dequantizing warp (no TMA bytes on it).
    s.kv_bars.init(kKvConsumers, kFp8 ? kDequantWarps : 1);
    ptx::mbarrier_init(&s.q_full, 1);
    ptx::mbarrier_init(&s.q_empty, 1);
    for (int i = 0; i < kNumSSlots; ++i) {
      ptx::mbarrier_init(&s.s_full[i], 1);
      ptx::mbarrier_init(&s.s_empty[i], kWarpgroupThreads);
      ptx::mbarrier_init(&s.p_full[i], kWarpgroupThreads);
    }
    ptx::mbarrier_init(&s.o_ready, kWarpgroupThreads);
    ptx::mbarrier_init(&s.o_full, 1);
    for (int i = 0; i < 2; ++i) {
      ptx::mbarrier_init(&s.alpha_full[i], kBM);
      ptx::mbarrier_init(&s.stats_full[i], kWarpgroupThreads);
    }
    ptx::fence_barrier_init();
  }
  if (warp == kMmaWarp) {  // the whole warp: .sync.aligned
    tc::alloc<kTmemAllocCols>(&s.tmem_base);
    tc::relinquish_alloc_permit();
  }
  tc::fence_before_thread_sync();
  __syncthreads();
  tc::fence_after_thread_sync();
  const uint32_t tmem = s.tmem_base;

  // Everything below reads memory written by earlier kernels (the schedule, q, the cache).
  ptx::grid_dependency_wait();
  ptx::grid_launch_dependents();

  const PartWork work(p.schedule, p.num_parts, blockIdx.x, p.seq_lens);
  const int m_block = blockIdx.y;
  if (warp == kProducerWarp) {
    if (lane == 0 || gathered) {
      producer_main<Element, kFormat>(s, p, &q_map, &kv_map, &kv_rope_map, &kv_scale_map, work, m_block, wd);
    }
  } else if (warp == kMmaWarp) {
    if (lane == 0) mma_main(s, work, tmem, wd);
  } else if (warp >= kSoftmaxWarp0 && warp < kSoftmaxWarp0 + 4) {
    softmax_main(s, p, work, m_block, tmem, wd);
  } else if (warp >= kCorrectionWarp0) {
    correction_main(s, p, work, m_block, tmem, wd);
  } else if (kFp8 && warp >= kDequantWarp0 && warp < kDequantWarp0 + kDequantWarps) {
    if constexpr (kFp8) dequantize_part<Element>(s, work, warp - kDequantWarp0, wd);
  }

  // Teardown: the epilogue waited for the last P V, which completes after every other MMA of this CTA
  // (tcgen05.commit tracks all earlier MMAs of the issuing thread), and its TMEM loads are done. An
  // expired watchdog instantiation did not wait: settle() lets its last copies and MMAs land first.
  wd.settle();
  tc::fence_before_thread_sync();
  __syncthreads();
  if (warp == kMmaWarp) {
    tc::fence_after_thread_sync();
    tc::dealloc<kTmemAllocCols>(tmem);
  }
#endif
}

}  // namespace jax_mla::sm100
