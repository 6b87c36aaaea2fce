// Device-side split-KV scheduler: computes the schedule of scheduler.h on the GPU from seq_lens,
// with no host synchronisation, so a decode step (and its CUDA graph) never waits for the host.
// One CTA: the prefix sums live in shared memory, then every part and every request is planned by
// its own thread through the closed forms of scheduler.h. Output is bit-identical to
// plan_schedule_host (checked by the GPU tests).
//
// The kernel sits on the critical path of every decode step (schedule -> decode -> combine), and
// most of its time is latency, not work: one load of seq_lens, two prefix sums, a few divisions,
// the stores. So the CTA is sized to the batch (ScheduleShape below): up to 128 requests one warp
// does both scans with shuffles alone; larger batches use more warps, each thread owning a
// contiguous chunk of requests whose seq_lens it loads all at once (unrolled, so the loads are in
// flight together rather than one latency each). Four barriers in the largest shape (two scans,
// the cost summary for choose_part_plan, the plan), one in the smallest (the old kernel had seven),
// plus one per step of the pieces plan's search when it runs (few requests: then a few steps).
#include <cstdint>
#include <cuda_runtime.h>

#include "launch.h"
#include "ptx.cuh"
#include "scheduler.h"

namespace jax_mla {
namespace {

// Dynamic shared memory: C (b + 1) int64 and split_offsets (b + 1) int32.
constexpr int64_t scheduler_smem_bytes(int batch) { return (static_cast<int64_t>(batch) + 1) * (8 + 4) + 8; }

// kThreads plan the parts (num_parts is often 66 or 132, so more threads than requests is useful);
// the first kScanWarps warps scan the requests, kChunk contiguous requests per thread.
template <int kThreads_, int kScanWarps_, int kChunk_>
struct ScheduleShape {
  static constexpr int kThreads = kThreads_;
  static constexpr int kScanWarps = kScanWarps_;
  static constexpr int kChunk = kChunk_;
  static constexpr int kMaxBatch = kScanWarps * 32 * kChunk;
  static_assert(kThreads % 32 == 0 && kScanWarps <= 32);
  // Either one scanning warp (no barrier inside the scans, the other warps skip them) or every
  // warp scans (the scans' barriers are then reached by the whole CTA).
  static_assert(kScanWarps == 1 || kScanWarps * 32 == kThreads);
};
using SmallSchedule = ScheduleShape<128, 1, 4>;    // b <= 128: warp-level scans, one barrier
using MediumSchedule = ScheduleShape<256, 8, 4>;   // b <= 1024
using LargeSchedule = ScheduleShape<1024, 32, 16>;  // b <= kMaxScheduleBatch
static_assert(LargeSchedule::kMaxBatch >= kMaxScheduleBatch);

// The second scan carries three counts at once (splits, many-split requests, other listed
// requests), packed in one 64-bit word: splits in the low 32 bits, then 16 bits per count. A
// count of requests never exceeds kMaxScheduleBatch, and the splits of a valid plan stay below
// 2^31 (schedule_size fits int32), so no field carries into the next.
static_assert(kMaxScheduleBatch < (1 << 16));
constexpr int kManyShift = 32;
constexpr int kFewShift = 48;
__device__ __forceinline__ uint64_t pack_counts(int num_splits, bool invariant) {
  const uint64_t many = many_split_class(num_splits, invariant) ? 1 : 0;
  const uint64_t few = num_splits != 1 && many == 0 ? 1 : 0;
  return static_cast<uint64_t>(num_splits) | (many << kManyShift) | (few << kFewShift);
}
__device__ __forceinline__ int splits_of(uint64_t c) { return static_cast<int>(c & 0xffffffffu); }
__device__ __forceinline__ int many_of(uint64_t c) { return static_cast<int>((c >> kManyShift) & 0xffff); }
__device__ __forceinline__ int few_of(uint64_t c) { return static_cast<int>((c >> kFewShift) & 0xffff); }

// Exclusive scan of one value per thread over the kScanWarps scanning warps. Returns the exclusive
// prefix and writes the grand total to *total (in every scanning thread). warp_totals
// (kScanWarps) is shared memory used by this call only. With one scanning warp there is no shared
// memory and no barrier (only that warp calls it); with several, the whole CTA calls it.
template <class Shape, typename T>
__device__ T scan_exclusive(T local, T* warp_totals, T* total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  T inc = local;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const T other = __shfl_up_sync(0xffffffff, inc, d);
    if (lane >= d) inc += other;
  }
  if constexpr (Shape::kScanWarps == 1) {
    *total = __shfl_sync(0xffffffff, inc, 31);
    return inc - local;
  } else {
    if (warp < Shape::kScanWarps && lane == 31) warp_totals[warp] = inc;
    __syncthreads();
    // Every scanning warp scans the (at most 32) warp totals itself: no second barrier.
    T t = lane < Shape::kScanWarps ? warp_totals[lane] : T(0);
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const T other = __shfl_up_sync(0xffffffff, t, d);
      if (lane >= d) t += other;
    }
    *total = __shfl_sync(0xffffffff, t, Shape::kScanWarps - 1);
    const T before = __shfl_sync(0xffffffff, t, (warp + 31) % 32);  // inclusive total of warp - 1
    return inc - local + (warp > 0 ? before : T(0));
  }
}

// The CostSummary of the non-empty requests over the kScanWarps scanning warps, from one partial
// summary per thread; same calling rules as scan_exclusive.
__device__ __forceinline__ CostSummary merge_summaries(CostSummary a, CostSummary b) {
  return {min(a.min_cost, b.min_cost), max(a.max_cost, b.max_cost), a.nonempty + b.nonempty};
}
__device__ __forceinline__ CostSummary shuffle_xor(CostSummary a, int d) {
  return {__shfl_xor_sync(0xffffffff, a.min_cost, d), __shfl_xor_sync(0xffffffff, a.max_cost, d),
          __shfl_xor_sync(0xffffffff, a.nonempty, d)};
}
template <class Shape>
__device__ CostSummary reduce_cost_summary(CostSummary local, CostSummary* warp_summaries) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) local = merge_summaries(local, shuffle_xor(local, d));
  if constexpr (Shape::kScanWarps == 1) {
    return local;
  } else {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (warp < Shape::kScanWarps && lane == 0) warp_summaries[warp] = local;
    __syncthreads();
    CostSummary r = lane < Shape::kScanWarps ? warp_summaries[lane] : CostSummary{INT32_MAX, 0, 0};
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) r = merge_summaries(r, shuffle_xor(r, d));
    return r;
  }
}

// Sum of one value per thread over the kScanWarps scanning warps (the pieces search's counts);
// same calling rules as scan_exclusive. Consecutive calls alternate between the two rows of
// warp_sums, so one barrier per call suffices: a row is written again only two calls later, after
// every thread has passed the barrier of the call between, hence finished reading it.
template <class Shape>
__device__ int64_t reduce_sum(int64_t local, int64_t (*warp_sums)[Shape::kScanWarps], int* round) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) local += __shfl_xor_sync(0xffffffff, local, d);
  if constexpr (Shape::kScanWarps == 1) {
    return local;
  } else {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    int64_t* row = warp_sums[*round & 1];
    *round += 1;
    if (warp < Shape::kScanWarps && lane == 0) row[warp] = local;
    __syncthreads();
    int64_t t = lane < Shape::kScanWarps ? row[lane] : 0;
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) t += __shfl_xor_sync(0xffffffff, t, d);
    return t;
  }
}

// kInvariant: the batch-invariant plan (chunks, whose parameters come in `chunks`). A template
// parameter rather than a branch on `chunks`, so that the default plans' instantiation is the code
// it was, with the same registers (the largest shape has no spare ones at 1024 threads).
template <class Shape, bool kInvariant>
__global__ void __launch_bounds__(Shape::kThreads)
    schedule_kernel(const int32_t* __restrict__ seq_lens, int batch, int num_parts, int32_t* __restrict__ schedule,
                    int32_t* __restrict__ zeroed, int num_zeroed, ChunkSpec chunks) {
  extern __shared__ int64_t smem[];
  int64_t* C = smem;                                                   // (batch + 1) cost prefix
  int32_t* split_offsets = reinterpret_cast<int32_t*>(C + batch + 1);  // (batch + 1)
  __shared__ int64_t cost_totals[Shape::kScanWarps];
  __shared__ uint64_t count_totals[Shape::kScanWarps];
  __shared__ CostSummary cost_summaries[Shape::kScanWarps];
  __shared__ int64_t piece_counts[2][Shape::kScanWarps];
  __shared__ PartPlan plan_shared;
  __shared__ int32_t num_listed_shared;
  constexpr int kChunk = Shape::kChunk;
  constexpr int kScanThreads = Shape::kScanWarps * 32;
  // Requests [lo, lo + count) of a scanning thread: contiguous chunks, so that its prefix values
  // follow from one scanned total each. ceil(batch / kScanThreads) <= kChunk by the shape's limit.
  const bool scans = threadIdx.x < kScanThreads;
  const int per = (batch + kScanThreads - 1) / kScanThreads;
  const int lo = scans ? min(batch, static_cast<int>(threadIdx.x) * per) : batch;
  const int count = min(per, batch - lo);

  ptx::grid_dependency_wait();  // seq_lens come from an earlier kernel
  // The SM90 fused merge's arrival counters (launch.h), here rather than by a memset on the stream:
  // one operation less per call. After the wait: an earlier call's decode kernel may still use them.
  for (int i = threadIdx.x; i < num_zeroed; i += Shape::kThreads) zeroed[i] = 0;

  // With one scanning warp the other warps skip straight to the barrier below; with several, every
  // thread scans (the shapes have no idle threads then) and the scans' barriers are uniform.
  if (Shape::kScanWarps > 1 || scans) {
    // All of this thread's seq_lens loads are issued before the first is used.
    // (kChunk) plan_request_cost of requests lo .. lo + count - 1 (fits int32)
    constexpr bool invariant = kInvariant;
    int cost[kChunk];
#pragma unroll
    for (int k = 0; k < kChunk; ++k) {
      if constexpr (invariant) {
        cost[k] = k < count ? chunked_request_cost(seq_lens[lo + k], chunks) : 0;
      } else {
        cost[k] = k < count ? request_cost(seq_lens[lo + k]) : 0;
      }
    }
    int64_t local_cost = 0;
    CostSummary local_summary{INT32_MAX, 0, 0};  // this thread's non-empty requests
#pragma unroll
    for (int k = 0; k < kChunk; ++k) {
      local_cost += cost[k];
      if (cost[k] > 0) local_summary = merge_summaries(local_summary, CostSummary{cost[k], cost[k], 1});
    }
    int64_t total_cost = 0;
    int64_t c = scan_exclusive<Shape>(local_cost, cost_totals, &total_cost);
    const CostSummary summary = reduce_cost_summary<Shape>(local_summary, cost_summaries);
    int round = 0;
    PartPlan plan{1, 0};  // the batch-invariant plan has no choice to make
    if constexpr (!invariant) {
      plan = choose_part_plan(total_cost, num_parts, summary, [&](int piece_blocks) {
        int64_t n = 0;
#pragma unroll
        for (int k = 0; k < kChunk; ++k) n += cost[k] > 0 ? pieces_of(cost[k] - kFixedOverheadBlocks, piece_blocks) : 0;
        return reduce_sum<Shape>(n, piece_counts, &round);
      });
    }

    // C of the chunk (for the parts' binary searches), and each request's split count from the two
    // prefix values this thread already holds.
    int splits[kChunk];  // (kChunk)
    uint64_t local_counts = 0;
#pragma unroll
    for (int k = 0; k < kChunk; ++k) {
      splits[k] = 1;
      if (k < count) {
        C[lo + k] = c;
        // The invariant plan's chunk count (an L1 hit: the seq_len was loaded above).
        if constexpr (invariant) {
          splits[k] = num_chunks(num_kv_blocks(seq_lens[lo + k]), chunks);
        } else {
          splits[k] = num_splits_planned(plan, c, c + cost[k]);
        }
        c += cost[k];
        local_counts += pack_counts(splits[k], invariant);
      }
    }
    uint64_t total_counts = 0;
    uint64_t counts = scan_exclusive<Shape>(local_counts, count_totals, &total_counts);

    // split_offsets (shared: plan_part needs them) and the combine list (global, scattered).
    int32_t* combine = schedule + combine_begin(batch, num_parts);  // (kCombineHeader + b)
    int32_t* list = combine + kCombineHeader;                       // (b)
    const int num_many = many_of(total_counts);
#pragma unroll
    for (int k = 0; k < kChunk; ++k) {
      if (k < count) {
        split_offsets[lo + k] = splits_of(counts);
        const int pos = combine_position(splits[k], many_split_class(splits[k], invariant), many_of(counts),
                                         few_of(counts), num_many);
        if (pos >= 0) list[pos] = lo + k;
        counts += pack_counts(splits[k], invariant);
      }
    }
    if (threadIdx.x == 0) {
      C[batch] = total_cost;
      plan_shared = plan;
      split_offsets[batch] = splits_of(total_counts);
      num_listed_shared = num_many + few_of(total_counts);
      combine[kCombineCount] = num_many + few_of(total_counts);
      combine[kCombineManyCount] = num_many;
      if constexpr (invariant) {
        int32_t* trailer = schedule + invariant_begin(batch, num_parts);  // (kInvariantFields)
        for (int f = 0; f < kInvariantFields; ++f) trailer[f] = 0;
        trailer[kInvChunkBlocks] = chunks.chunk_blocks;
        trailer[kInvMaxChunks] = chunks.max_chunks;
      }
    }
  }
  __syncthreads();  // C, split_offsets and the totals are complete

  const PartPlan plan = plan_shared;
  for (int part = threadIdx.x; part < num_parts; part += Shape::kThreads) {
    int32_t info[kPartFields];
    if constexpr (kInvariant) {
      plan_part_chunked(C, split_offsets, seq_lens, batch, num_parts, chunks, part, info);
    } else {
      plan_part(C, split_offsets, batch, plan, part, info);
    }
    int32_t* dst = schedule + static_cast<int64_t>(part) * kPartFields;
#pragma unroll
    for (int f = 0; f < kPartFields; ++f) dst[f] = info[f];
  }
  // Coalesced copies: split_offsets, and the unused tail of the list.
  int32_t* out_offsets = schedule + split_offsets_begin(num_parts);  // (b + 1)
  for (int r = threadIdx.x; r <= batch; r += Shape::kThreads) out_offsets[r] = split_offsets[r];
  int32_t* list = schedule + combine_begin(batch, num_parts) + kCombineHeader;  // (b)
  for (int i = num_listed_shared + threadIdx.x; i < batch; i += Shape::kThreads) list[i] = -1;
  ptx::grid_launch_dependents();
}

template <class Shape>
cudaError_t launch_shape(const int32_t* seq_lens, int batch, int num_parts, int32_t* schedule, int32_t* zeroed,
                         int num_zeroed, ChunkSpec chunks, cudaStream_t stream) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(1);
  cfg.blockDim = dim3(Shape::kThreads);
  cfg.dynamicSmemBytes = scheduler_smem_bytes(batch);
  cfg.stream = stream;
  if (chunks.invariant()) {
    return cudaLaunchKernelEx(&cfg, schedule_kernel<Shape, true>, seq_lens, batch, num_parts, schedule, zeroed,
                              num_zeroed, chunks);
  }
  return cudaLaunchKernelEx(&cfg, schedule_kernel<Shape, false>, seq_lens, batch, num_parts, schedule, zeroed,
                            num_zeroed, chunks);
}

}  // namespace

cudaError_t launch_schedule(const int32_t* seq_lens, int batch, int num_parts, int32_t* schedule, cudaStream_t stream,
                            int32_t* zeroed, int num_zeroed, ChunkSpec chunks) {
  if (batch <= SmallSchedule::kMaxBatch) {
    return launch_shape<SmallSchedule>(seq_lens, batch, num_parts, schedule, zeroed, num_zeroed, chunks, stream);
  }
  if (batch <= MediumSchedule::kMaxBatch) {
    return launch_shape<MediumSchedule>(seq_lens, batch, num_parts, schedule, zeroed, num_zeroed, chunks, stream);
  }
  return launch_shape<LargeSchedule>(seq_lens, batch, num_parts, schedule, zeroed, num_zeroed, chunks, stream);
}

cudaError_t setup_schedule_kernel() {
  // Only the largest shape needs more than the default 48 KB of dynamic shared memory.
  static_assert(scheduler_smem_bytes(MediumSchedule::kMaxBatch) <= 48 * 1024);
  for (auto kernel : {schedule_kernel<LargeSchedule, false>, schedule_kernel<LargeSchedule, true>}) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(scheduler_smem_bytes(kMaxScheduleBatch)));
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace jax_mla
