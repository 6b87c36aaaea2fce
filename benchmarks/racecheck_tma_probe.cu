// Does compute-sanitizer racecheck follow an ordering that passes through a bulk copy's transaction
// count? A probe of the SM90 FP8 path's slot reuse (cuda/sm90/fp8_tiles.cuh, common/fp8_tile.cuh),
// with nothing else around it.
//
// Over the FP8 cache racecheck reports hazards between the dequantizing warps' stores into a ring
// slot and the consumers' `zero_dead_v_rows` stores into the same slot (docs/performance.md, open
// item 0). By reading, the pair is ordered: a consumer writes a slot after waiting on its full
// barrier, which the rewriting warps complete after their stores; the slot's next rewrite starts
// after the consumers released it (empty barrier), the producer thread saw that, issued the next
// tile's copy, and the copy's bytes completed raw_full, which the rewriting warps wait on. The last
// link is the copy engine's transaction count, not a thread's arrival. This kernel is that cycle
// alone, one CTA, two slots, `rounds` tiles:
//   warp 0, lane 0   producer: waits empty[s] (from the third round), then fills raw[s] and
//                    completes raw_full[s]
//   warp 1           rewriter: waits raw_full[s], writes data[s] = raw[s] + round, arrives full[s]
//   warps 2-3        consumers: wait full[s], check data[s], overwrite it with zeros (as
//                    zero_dead_v_rows), arrive empty[s]
//   mode 0  raw[s] by cp.async.bulk, raw_full[s] completed by its transaction bytes (the kernel's way)
//   mode 1  the same, but the consumers release the slot (arrive on empty[s]) before their
//           zeroing stores (a real race with the slot's next rewrite: the control that racecheck
//           must flag)
//   mode 2  raw[s] by the producer thread's own stores and a plain arrive on raw_full[s] (no copy
//           engine: every link a thread's arrival)
// If modes 0 and 2 both report no hazard, the tool follows the transaction count and the kernel's
// reports need another explanation; if mode 0 reports and mode 2 does not, it does not follow it.
//
//   nvcc -std=c++17 -O2 -gencode arch=compute_90a,code=sm_90a benchmarks/racecheck_tma_probe.cu -o /tmp/racecheck_tma_probe
//   for m in 0 1 2; do compute-sanitizer --tool racecheck --racecheck-report hazard /tmp/racecheck_tma_probe $m; done
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

namespace {

constexpr int kThreads = 128;
constexpr int kSlots = 2;
constexpr int kWords = 256;  // floats a slot: 1 KB, a multiple of 16 bytes for the bulk copy
constexpr int kConsumerWarps = 2;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT;\n"
      "}\n" ::"r"(smem_addr(bar)),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}

__global__ void __launch_bounds__(kThreads, 1) slot_reuse(int mode, int rounds, const float* src, int* wrong) {
  __shared__ alignas(128) float raw[kSlots][kWords];
  __shared__ alignas(128) float data[kSlots][kWords];
  __shared__ uint64_t raw_full[kSlots], full[kSlots], empty[kSlots];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kSlots; ++s) {
      mbar_init(&raw_full[s], 1);
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], kConsumerWarps);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  int bad = 0;
  for (int r = 0; r < rounds; ++r) {
    const int s = r % kSlots;
    const uint32_t use = static_cast<uint32_t>(r / kSlots);  // the slot's use: the barriers' phase
    if (warp == 0 && lane == 0) {
      if (r >= kSlots) mbar_wait(&empty[s], (use - 1) & 1);
      if (mode == 2) {
        for (int i = 0; i < kWords; ++i) raw[s][i] = src[i];
        mbar_arrive(&raw_full[s]);
      } else {
        mbar_arrive_expect_tx(&raw_full[s], sizeof(raw[s]));
        bulk_copy(raw[s], src, sizeof(raw[s]), &raw_full[s]);
      }
    } else if (warp == 1) {
      mbar_wait(&raw_full[s], use & 1);
      for (int i = lane; i < kWords; i += 32) data[s][i] = raw[s][i] + static_cast<float>(r);
      __syncwarp();
      if (lane == 0) mbar_arrive(&full[s]);
    } else if (warp >= 2) {
      mbar_wait(&full[s], use & 1);
      const int t = threadIdx.x - 64;
      for (int i = t; i < kWords; i += 32 * kConsumerWarps) bad += data[s][i] != src[i] + static_cast<float>(r);
      __syncwarp();
      if (mode == 1 && lane == 0) mbar_arrive(&empty[s]);  // released too early
      for (int i = t; i < kWords; i += 32 * kConsumerWarps) data[s][i] = 0.0f;  // as zero_dead_v_rows
      __syncwarp();
      if (mode != 1 && lane == 0) mbar_arrive(&empty[s]);
    }
  }
  if (bad) atomicAdd(wrong, bad);
}

}  // namespace

int main(int argc, char** argv) {
  const int mode = argc > 1 ? std::atoi(argv[1]) : 0;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 16;
  float host[kWords];
  for (int i = 0; i < kWords; ++i) host[i] = static_cast<float>(i);
  float* src = nullptr;
  int* wrong = nullptr;
  if (cudaMalloc(&src, sizeof(host)) != cudaSuccess || cudaMalloc(&wrong, sizeof(int)) != cudaSuccess) return 2;
  cudaMemcpy(src, host, sizeof(host), cudaMemcpyHostToDevice);
  cudaMemset(wrong, 0, sizeof(int));
  slot_reuse<<<1, kThreads>>>(mode, rounds, src, wrong);
  const cudaError_t e = cudaDeviceSynchronize();
  int h_wrong = -1;
  cudaMemcpy(&h_wrong, wrong, sizeof(int), cudaMemcpyDeviceToHost);
  std::printf("mode %d rounds %d: %s, wrong values %d\n", mode, rounds, cudaGetErrorString(e), h_wrong);
  cudaFree(src);
  cudaFree(wrong);
  return e == cudaSuccess ? 0 : 1;
}
