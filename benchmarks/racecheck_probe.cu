// Does compute-sanitizer racecheck honour a named barrier over part of a CTA? A probe of the SM90
// epilogue's row-sum exchange (cuda/sm90/epilogue.cuh store_piece), with nothing else around it.
//
// racecheck reports ~100,000 "potential RAW" hazards between the write and the read of
// s.row_sum in the SM90 epilogue (docs/performance.md, open item 0): two consumer warpgroups
// (threads 128-383 of 384) each write their partial row sums to shared memory, meet at
// `bar.sync 3, 256`, and read both. This kernel does exactly that and only that, for `pieces`
// pieces with the same two parity slots, while warpgroup 0 (the decode kernel's producer) does not
// take part:
//   mode 0  bar.sync 3, 256 between the writes and the reads (the epilogue's order; no race)
//   mode 1  __syncthreads() instead, every thread of the CTA (no race)
//   mode 2  no barrier at all (a real race: the control that racecheck must flag)
//   mode 3  the mainloop's P hand-off instead (cuda/sm90/mainloop.cuh owner_step / other_step): the
//           tile's owner (consumers alternate by tile) writes its row maxima, `bar.arrive 1 + owner,
//           256`; the other consumer `bar.sync 1 + owner, 256`, then reads them. A slot is rewritten
//           two tiles later, ordered only through the other direction's arrive / sync. racecheck
//           reported this pair once over the kernel (855cdff): no hazard here says the tool follows
//           arrive -> sync, and the kernel's report needs another explanation.
// Each thread checks the sum it reads against the value both writers stored, so a real ordering
// failure also shows as a wrong count. Under racecheck, modes 0 and 1 report no hazard if the tool
// models partial named barriers; mode 2 must report.
//
//   nvcc -std=c++17 -O2 -gencode arch=compute_90a,code=sm_90a benchmarks/racecheck_probe.cu -o /tmp/racecheck_probe
//   for m in 0 1 2; do compute-sanitizer --tool racecheck --racecheck-report hazard /tmp/racecheck_probe $m; done
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

namespace {

constexpr int kThreads = 384;         // producer warpgroup + two consumer warpgroups, as in the SM90 kernel
constexpr int kConsumerThreads = 256;
constexpr int kRows = 64;             // one row block
constexpr int kBarRowSum = 3;         // cuda/sm90/config.h
constexpr int kBarPReady = 1;         // cuda/sm90/config.h: 1 + owner

__global__ void __launch_bounds__(kThreads, 1) row_sum_exchange(int mode, int pieces, int* wrong) {
  __shared__ float row_sum[2][2][kRows];  // (parity, consumer, row), as SharedStorage::row_sum
  const int warpgroup = threadIdx.x / 128;
  const int thread = threadIdx.x % 128;
  const int row = thread / 2;          // two threads a row per consumer
  int bad = 0;
  if (mode == 3) {
    __shared__ float row_max[2][kRows];  // (owner, row), as SharedStorage::row_max
    if (warpgroup == 0) return;          // the producer warpgroup takes no part
    const int consumer = warpgroup - 1;
    for (int tile = 0; tile < pieces; ++tile) {
      const int owner = tile & 1;
      if (consumer == owner) {
        if ((thread & 1) == 0) row_max[owner][row] = static_cast<float>(tile);
        asm volatile("bar.arrive %0, %1;" ::"r"(kBarPReady + owner), "r"(kConsumerThreads) : "memory");
      } else {
        asm volatile("bar.sync %0, %1;" ::"r"(kBarPReady + owner), "r"(kConsumerThreads) : "memory");
        bad += row_max[owner][row] != static_cast<float>(tile);
      }
    }
    if (bad) atomicAdd(wrong, bad);
    return;
  }
  for (int piece = 0; piece < pieces; ++piece) {
    const int parity = piece & 1;
    if (warpgroup > 0) {
      const int consumer = warpgroup - 1;
      if ((thread & 1) == 0) row_sum[parity][consumer][row] = static_cast<float>(piece * 2 + consumer);
    }
    if (mode == 0) {
      if (warpgroup > 0) asm volatile("bar.sync %0, %1;" ::"r"(kBarRowSum), "r"(kConsumerThreads) : "memory");
    } else if (mode == 1) {
      __syncthreads();
    }
    if (warpgroup > 0) {
      const float total = row_sum[parity][0][row] + row_sum[parity][1][row];
      bad += total != static_cast<float>(4 * piece + 1);
    }
    if (mode == 1) __syncthreads();  // the slot of parity p is rewritten two pieces later
  }
  if (bad) atomicAdd(wrong, bad);
}

}  // namespace

int main(int argc, char** argv) {
  const int mode = argc > 1 ? std::atoi(argv[1]) : 0;
  const int pieces = argc > 2 ? std::atoi(argv[2]) : 8;
  int* wrong = nullptr;
  cudaMalloc(&wrong, sizeof(int));
  cudaMemset(wrong, 0, sizeof(int));
  row_sum_exchange<<<2, kThreads>>>(mode, pieces, wrong);
  const cudaError_t err = cudaDeviceSynchronize();
  int host = -1;
  cudaMemcpy(&host, wrong, sizeof(int), cudaMemcpyDeviceToHost);
  std::printf("mode %d (%s), %d pieces: %s, wrong sums %d\n", mode,
              mode == 0   ? "bar.sync 3, 256"
              : mode == 1 ? "__syncthreads"
              : mode == 2 ? "no barrier"
                          : "P hand-off: bar.arrive / bar.sync 1 + owner, 256",
              pieces,
              cudaGetErrorString(err), host);
  return err == cudaSuccess ? 0 : 1;
}
