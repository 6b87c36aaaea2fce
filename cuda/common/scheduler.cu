// Device-side split-KV scheduler: computes the schedule of scheduler.h on the GPU from seq_lens,
// with no host synchronisation, so a decode step (and its CUDA graph) never waits for the host.
// One CTA: the prefix sums live in shared memory, then every part and every request is planned by
// its own thread through the closed forms of scheduler.h. Output is bit-identical to
// plan_schedule_host (checked by the GPU tests).
#include <cstdint>
#include <cuda_runtime.h>

#include "launch.h"
#include "ptx.cuh"
#include "scheduler.h"

namespace jax_mla {
namespace {

constexpr int kSchedulerThreads = 1024;

// Exclusive prefix sum of vals[0, n) into out[0, n], in place allowed (out may alias vals shifted by
// one: out[i + 1] = sum of vals[0..i]). Block-wide, chunked: thread t owns a contiguous chunk.
template <typename T>
__device__ void block_exclusive_scan(const T* vals, T* out, int n, T* warp_totals) {
  const int t = threadIdx.x, lane = t % 32, warp = t / 32;
  const int per = (n + kSchedulerThreads - 1) / kSchedulerThreads;
  const int lo = min(n, t * per), hi = min(n, lo + per);
  T local = 0;
  for (int i = lo; i < hi; ++i) local += vals[i];
  // Inclusive scan of the chunk totals across the warp, then across warps.
  T inc = local;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const T other = __shfl_up_sync(0xffffffff, inc, d);
    if (lane >= d) inc += other;
  }
  if (lane == 31) warp_totals[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    T w = warp_totals[lane];
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const T other = __shfl_up_sync(0xffffffff, w, d);
      if (lane >= d) w += other;
    }
    warp_totals[lane] = w;  // inclusive over warps
  }
  __syncthreads();
  T running = inc - local + (warp > 0 ? warp_totals[warp - 1] : T(0));
  // Each thread rewrites only its own chunk, so out may alias vals.
  for (int i = lo; i < hi; ++i) {
    const T v = vals[i];
    out[i] = running;
    running += v;
  }
  if (t == kSchedulerThreads - 1) out[n] = warp_totals[31];
  __syncthreads();
}

__global__ void __launch_bounds__(kSchedulerThreads)
    schedule_kernel(const int32_t* __restrict__ seq_lens, int batch, int num_parts, int32_t* __restrict__ schedule) {
  extern __shared__ int64_t smem[];
  int64_t* C = smem;                                              // (batch + 1) cost prefix
  int32_t* split_offsets = reinterpret_cast<int32_t*>(C + batch + 1);  // (batch + 1)
  __shared__ int64_t totals64[32];
  __shared__ int32_t totals32[32];
  ptx::grid_dependency_wait();  // seq_lens come from an earlier kernel

  for (int r = threadIdx.x; r < batch; r += kSchedulerThreads) C[r] = request_cost(seq_lens[r]);
  __syncthreads();
  block_exclusive_scan<int64_t>(C, C, batch, totals64);
  const int64_t w = units_per_part(C[batch], num_parts);

  for (int r = threadIdx.x; r < batch; r += kSchedulerThreads) split_offsets[r] = num_splits_of(C, r, w);
  __syncthreads();
  block_exclusive_scan<int32_t>(split_offsets, split_offsets, batch, totals32);

  int32_t* out_offsets = schedule + static_cast<int64_t>(num_parts) * kPartFields;
  for (int r = threadIdx.x; r <= batch; r += kSchedulerThreads) out_offsets[r] = split_offsets[r];
  for (int part = threadIdx.x; part < num_parts; part += kSchedulerThreads) {
    int32_t info[kPartFields];
    plan_part(C, batch, w, part, info);
    if (info[kPartBeginReq] < batch) {
      info[kPartBeginSlot] = part_begin_slot(C, split_offsets, w, part, info[kPartBeginReq]);
    }
    int32_t* dst = schedule + static_cast<int64_t>(part) * kPartFields;
#pragma unroll
    for (int f = 0; f < kPartFields; ++f) dst[f] = info[f];
  }
  ptx::grid_launch_dependents();
}

}  // namespace

int64_t scheduler_smem_bytes(int batch) { return (batch + 1) * (8 + 4) + 8; }

cudaError_t launch_schedule(const int32_t* seq_lens, int batch, int num_parts, int32_t* schedule,
                            cudaStream_t stream) {
  const int64_t smem = scheduler_smem_bytes(batch);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(1);
  cfg.blockDim = dim3(kSchedulerThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  return cudaLaunchKernelEx(&cfg, schedule_kernel, seq_lens, batch, num_parts, schedule);
}

cudaError_t setup_schedule_kernel() {
  return cudaFuncSetAttribute(schedule_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(scheduler_smem_bytes(kMaxScheduleBatch)));
}

}  // namespace jax_mla
