// The ceiling of the decode kernels' KV load path, measured without any compute: how fast can TMA
// move KV tiles, (64 tokens, 576) bf16 as 9 boxes of (64, 64) with the 128-byte swizzle, exactly as
// the producer of cuda/common/kv_producer.cuh loads them, into the shared memory of every SM?
//
// One CTA per SM (the shared-memory request allows no second one); its one thread streams a
// sequence of tiles through a ring of `stages` shared-memory slots: a slot is reloaded as soon as its
// previous tile landed, so `stages` tiles are in flight per SM all the time. Tiles come from a
// (tiles * 64, 576) buffer of `ws` MB: a small buffer stays L2-resident after the first pass, a
// large one streams from DRAM. `share` consecutive CTAs walk the same tile sequence at the same
// time, as the two row blocks of h_q = 128 do (2): one of them reads DRAM, the other finds the tile
// in L2. Tile ids are a fixed pseudo-random permutation (paged caches scatter pages); the sequences
// of different groups do not overlap while groups x tiles per CTA <= tiles in the working set.
//
// Prints, per configuration, the median time of one kernel over `reps` runs, the bytes landed in
// shared memory per second (the L2 -> SM rate) and the same divided by `share` (what DRAM supplies
// when the other sharers find each tile in L2). docs/performance.md (fifth session of 2026-12-03, next step 4) says why.
//
// Build and run on the GPU machine (compile only here):
//   nvcc -std=c++17 -O2 -arch=sm_90a -I cuda benchmarks/tma_bandwidth.cu cuda/common/tensor_map.cu \
//        -o /tmp/tma_bandwidth && /tmp/tma_bandwidth            # the default sweep
//   /tmp/tma_bandwidth WS_MB STAGES SHARE [TILES_PER_CTA] [REPS]  # one configuration
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda.h>
#include <cuda_runtime.h>

#include "common/kv_producer.cuh"
#include "common/ptx.cuh"
#include "common/tensor_map.h"

namespace {

using jax_mla::kKvBoxBytes;
using jax_mla::kKvBoxCols;
using jax_mla::kKvBoxElems;
using jax_mla::kKvBoxesQK;
using jax_mla::kKvTileBytes;

constexpr int kMaxStages = 3;  // 3 x 72 KB: what one SM's shared memory holds
constexpr int kTileRows = 64;

#define CHECK_CUDA(x)                                                                  \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

struct alignas(1024) Ring {
  uint16_t tile[kMaxStages][kKvBoxesQK][kKvBoxElems];  // (stage, box, 64, 64)
  uint64_t full[kMaxStages];                            // one barrier per slot, all 9 boxes on it
};

// Tile of step t for CTA group g: a multiplicative permutation of [0, tiles) (odd multiplier,
// tiles a power of two), offset per group so the groups do not read in lock step.
__host__ __device__ inline uint32_t tile_of(uint32_t g, uint32_t t, uint32_t tiles, uint32_t tiles_per_cta) {
  return ((g * tiles_per_cta + t) * 2654435761u) & (tiles - 1);
}

__global__ void __launch_bounds__(32, 1)
    stream_tiles(const __grid_constant__ CUtensorMap map, int stages, int share, uint32_t tiles,
                 uint32_t tiles_per_cta, uint32_t* sink) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  extern __shared__ uint8_t smem_raw[];
  Ring& ring = *reinterpret_cast<Ring*>(jax_mla::ptx::align_dynamic_smem<1024>(smem_raw));
  if (threadIdx.x != 0) return;
  for (int s = 0; s < stages; ++s) jax_mla::ptx::mbarrier_init(&ring.full[s], 1);
  jax_mla::ptx::fence_barrier_init();
  const uint32_t group = blockIdx.x / share;
  for (uint32_t t = 0; t < tiles_per_cta; ++t) {
    const int s = static_cast<int>(t % stages);
    if (t >= static_cast<uint32_t>(stages)) {
      jax_mla::ptx::mbarrier_wait(&ring.full[s], ((t / stages) - 1) & 1);  // the slot's previous tile landed
    }
    const int row = static_cast<int>(tile_of(group, t, tiles, tiles_per_cta)) * kTileRows;
    jax_mla::ptx::mbarrier_arrive_expect_tx(&ring.full[s], kKvTileBytes);
    for (int box = 0; box < kKvBoxesQK; ++box) {
      jax_mla::ptx::tma_load_2d(&ring.tile[s][box][0], &map, &ring.full[s], box * kKvBoxCols, row);
    }
  }
  // Drain: the last `stages` tiles.
  for (uint32_t t = tiles_per_cta > static_cast<uint32_t>(stages) ? tiles_per_cta - stages : 0; t < tiles_per_cta;
       ++t) {
    const int s = static_cast<int>(t % stages);
    jax_mla::ptx::mbarrier_wait(&ring.full[s], (t / stages) & 1);
  }
  // Keep the loads observable.
  atomicAdd(sink, ring.tile[0][0][threadIdx.x]);
#endif
}

struct Result {
  double us, gbps_sm, gbps_unshared;
};

Result run(void* buf, uint32_t tiles, int stages, int share, uint32_t tiles_per_cta, int reps, int ctas,
           uint32_t* sink) {
  CUtensorMap map;
  const char* err = nullptr;
  if (!jax_mla::make_tensor_map_2d(&map, buf, jax_mla::DType::kBF16, uint64_t(tiles) * kTileRows, 576, 576,
                                   kTileRows, kKvBoxCols, &err)) {
    std::fprintf(stderr, "tensor map: %s\n", err);
    std::exit(1);
  }
  const int smem = static_cast<int>(sizeof(Ring)) + 1024;  // always 3 slots: one CTA per SM
  CHECK_CUDA(cudaFuncSetAttribute(stream_tiles, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int r = 0; r < reps + 2; ++r) {  // 2 warm-up runs (the first also fills L2 for small sets)
    CHECK_CUDA(cudaEventRecord(a));
    stream_tiles<<<ctas, 32, smem>>>(map, stages, share, tiles, tiles_per_cta, sink);
    CHECK_CUDA(cudaEventRecord(b));
    CHECK_CUDA(cudaEventSynchronize(b));
    CHECK_CUDA(cudaGetLastError());
    float m = 0.f;
    CHECK_CUDA(cudaEventElapsedTime(&m, a, b));
    if (r >= 2) ms.push_back(m);
  }
  std::sort(ms.begin(), ms.end());
  const double sec = ms[ms.size() / 2] * 1e-3;
  const double landed = double(ctas) * tiles_per_cta * kKvTileBytes;
  CHECK_CUDA(cudaEventDestroy(a));
  CHECK_CUDA(cudaEventDestroy(b));
  // Unshared: the bytes of one CTA per sharing group, what DRAM supplies when the other sharers
  // find each tile in L2 (for a large working set, where tiles do not repeat).
  return {sec * 1e6, landed / sec * 1e-9, landed / share / sec * 1e-9};
}

}  // namespace

int main(int argc, char** argv) {
  int dev = 0, sms = 0;
  CHECK_CUDA(cudaGetDevice(&dev));
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const uint64_t max_ws_mb = 4096;
  void* buf = nullptr;
  CHECK_CUDA(cudaMalloc(&buf, max_ws_mb << 20));
  CHECK_CUDA(cudaMemset(buf, 0, max_ws_mb << 20));
  uint32_t* sink = nullptr;
  CHECK_CUDA(cudaMalloc(&sink, sizeof(uint32_t)));

  struct Config {
    uint64_t ws_mb;
    int stages, share;
  };
  std::vector<Config> configs;
  // 132 groups x 240 tiles < the 32768 tiles of the 4 GB set: from DRAM, no group re-reads a tile
  // another group read (which could hit L2).
  uint32_t tiles_per_cta = 240;
  int reps = 5;
  if (argc >= 4) {
    configs.push_back({std::strtoull(argv[1], nullptr, 10), std::atoi(argv[2]), std::atoi(argv[3])});
    if (argc >= 5) tiles_per_cta = static_cast<uint32_t>(std::atoi(argv[4]));
    if (argc >= 6) reps = std::atoi(argv[5]);
  } else {
    for (uint64_t ws : {uint64_t(16), max_ws_mb})
      for (int share : {1, 2})
        for (int stages : {1, 2, 3}) configs.push_back({ws, stages, share});
  }
  std::printf("# %d SMs, one CTA each; tiles of 64 x 576 bf16 (%d KB) as 9 TMA boxes; %u tiles per CTA\n", sms,
              kKvTileBytes / 1024, tiles_per_cta);
  std::printf("%8s %7s %6s %10s %14s %14s\n", "ws_MB", "stages", "share", "us", "GB/s_into_SMs",
              "GB/s_unshared");
  for (const Config& c : configs) {
    if (c.stages < 1 || c.stages > kMaxStages || c.share < 1 || c.ws_mb > max_ws_mb) {
      std::fprintf(stderr, "bad configuration (stages 1..%d, share >= 1, ws <= %llu MB)\n", kMaxStages,
                   static_cast<unsigned long long>(max_ws_mb));
      return 2;
    }
    // A power of two of tiles that fits the working set.
    uint32_t tiles = 1;
    while (uint64_t(tiles) * 2 * kKvTileBytes <= (c.ws_mb << 20)) tiles *= 2;
    const Result r = run(buf, tiles, c.stages, c.share, tiles_per_cta, reps, sms, sink);
    std::printf("%8llu %7d %6d %10.1f %14.0f %14.0f\n", static_cast<unsigned long long>(c.ws_mb), c.stages, c.share,
                r.us, r.gbps_sm, r.gbps_unshared);
  }
  CHECK_CUDA(cudaFree(buf));
  CHECK_CUDA(cudaFree(sink));
  return 0;
}
