// The SM90 (H100/H200) MLA decode kernel: shared storage and barrier setup, then the warp-role
// dispatch. Each role lives in its own file:
//   producer.cuh     warpgroup 0, one thread   Q and the KV box ring by TMA (common/kv_producer.cuh)
//   fp8_tiles.cuh    warpgroup 0, warps 1-3    FP8 cache: the raw tile rewritten as 16-bit boxes
//   (warpgroup 0, warps 1-3: with the in-kernel merge, the requests with no piece; split_merge.cuh)
//   mainloop.cuh     warpgroups 1 and 2        the seesaw consumers: S = Q K^T, softmax, O += P V
//   softmax.cuh                                their online softmax (lazy rescaling)
//   epilogue.cuh                               per piece: row sums, normalise, store out / partial
//   split_merge.cuh                            after the last piece: the in-kernel split merge
// See config.h for the CTA layout and the shared-memory plan, docs/design.md for the semantics.
//
// Grid: (num_m_blocks, num_parts): the row blocks of one part, which read the same KV tiles, get
// consecutive CTA ids. CTA (mb, p) walks the pieces of work of part p of the split-KV schedule
// (cuda/common/work_iterator.h) for query rows [64 mb, 64 mb + 64) of each request; the producer
// and both consumers walk the same pieces and the same tile sequence, so they agree on every ring
// slot and parity without exchanging anything but the barriers.
//
// kFormat: the cache's format. An FP8 cache (fp8_tiles.cuh) lands as raw bytes, and warps 1-3 of
// warpgroup 0 turn it into the 16-bit boxes the consumers read; kv_map, kv_group_map and
// kv_scale_map are then its byte, RoPE and scale views (launch.h).
//
// kWatchdog: the self-check's instantiation, whose every barrier wait gives up at a deadline
// (common/watchdog.cuh); production instantiates false. It never merges splits in the kernel (the
// self-check passes no merge counters; the launcher turns the merge off for it), so it holds no
// wait on other CTAs and no trap.
#pragma once

#include <cstdint>
#include <cuda.h>
#include <cuda_runtime.h>
#include <type_traits>

#include "../common/config.h"
#include "../common/problem.h"
#include "../common/ptx.cuh"
#include "../common/watchdog.cuh"
#include "../common/work_iterator.h"
#include "config.h"
#include "launch_plan.h"
#include "mainloop.cuh"
#include "producer.cuh"
#include "split_merge.cuh"

namespace jax_mla::sm90 {

template <typename Element, bool kWatchdog, KvFormat kFormat>
__global__ void __launch_bounds__(kThreads, 1)
    decode_kernel(const __grid_constant__ DecodeProblem p, const __grid_constant__ LaunchPlan plan,
                  const __grid_constant__ CUtensorMap q_map,
                  const __grid_constant__ CUtensorMap kv_map, const __grid_constant__ CUtensorMap kv_group_map,
                  const __grid_constant__ CUtensorMap kv_scale_map, const __grid_constant__ WatchdogParams watchdog) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using W = std::conditional_t<kWatchdog, Watchdog, NoWatchdog>;
  const W wd = W::start(watchdog);
  extern __shared__ uint8_t smem_raw[];
  auto& s = *reinterpret_cast<SharedStorage<Element>*>(ptx::align_dynamic_smem<1024>(smem_raw));
  constexpr bool kFp8 = kFormat == KvFormat::kFp8;
  // Grouped copies (kv_producer.cuh kBoxesPerGroup) where a tile is one cache row (pages of >= 64
  // tokens); smaller pages load box by box. Producer and consumers take the same decision. An FP8
  // cache's boxes complete one by one, by the dequantizing warps.
  const bool grouped_copies = !kFp8 && p.page_size >= kBlockN;
  // An FP8 cache of one-token pages (the sparse decode's view): warp 0 gathers it (producer.cuh).
  const bool gathered = kFp8 && p.page_size == 1;
  if (threadIdx.x == 0) {
    ptx::prefetch_tensor_map(&q_map);
    ptx::prefetch_tensor_map(&kv_map);
    if (grouped_copies || kFp8) ptx::prefetch_tensor_map(&kv_group_map);
    if (kFp8) {
      ptx::prefetch_tensor_map(&kv_scale_map);
      for (int t = 0; t < kRingTiles; ++t) ptx::mbarrier_init(&s.fp8.raw_full[t], gathered ? kGatherLanes : 1);
    }
    s.kv_bars.init(kNumConsumers, kFp8 ? kDequantWarps : 1);
    ptx::mbarrier_init(&s.q_full, 1);
    ptx::mbarrier_init(&s.q_empty, kNumConsumers);
    ptx::fence_barrier_init();
  }
  __syncthreads();  // barriers initialised
  // Everything below reads memory written by earlier kernels (the schedule, q, the cache).
  ptx::grid_dependency_wait();
  ptx::grid_launch_dependents();

  // Row blocks first in the grid: the row blocks of one part, which read the same KV tiles, get
  // consecutive CTA ids.
  const int m_block = blockIdx.x;
  const PartWork work(p.schedule, p.num_parts, blockIdx.y, p.seq_lens);
  // Warp-uniform by construction (a shuffle from lane 0), so branches on it are not divergent for
  // ptxas: wgmma in a branch it cannot prove uniform gets serialized.
  const int warpgroup = __shfl_sync(0xffffffff, static_cast<int>(threadIdx.x / 128), 0);
  if (warpgroup == 0) {
    ptx::setmaxnreg_dec<kProducerRegs>();
    if (threadIdx.x == 0 || (gathered && threadIdx.x < 32)) {
      producer_main<Element, kFormat>(s, p, &q_map, &kv_map, grouped_copies || kFp8 ? &kv_group_map : nullptr,
                                      &kv_scale_map, work, m_block, wd);
    } else if (threadIdx.x >= 32) {
      if constexpr (kFp8) dequantize_part<Element>(s, work, threadIdx.x / 32 - 1, wd);
      // No combine kernel runs after this one: warps 1-3 write the requests with no piece.
      if (!kWatchdog && plan.fused_merge) {
        write_empty_requests<Element>(p, blockIdx.x + blockIdx.y * gridDim.x, gridDim.x * gridDim.y,
                                      threadIdx.x - 32, 96);
      }
    }
    __syncwarp();
  } else {
    ptx::setmaxnreg_inc<kConsumerRegs>();
    consumer_main<Element, !kFp8>(s, p, plan, work, m_block, warpgroup - 1, grouped_copies, wd);
  }
  wd.settle();  // an expired watchdog instantiation: let its last copies and wgmmas land
  // A no-op for correctness (every warp is converged here), but ptxas needs the roles to rejoin at a
  // warp barrier: without it, it serialises the consumers' wgmmas for lack of registers (C7512) and
  // spills (CUDA 13.0).
  __syncwarp();
#endif
}

}  // namespace jax_mla::sm90
