// The ceiling of the decode kernels' KV load path, measured without any compute: how fast can TMA
// move KV tiles, (64 tokens, 576) bf16 as 9 boxes of (64, 64) with the 128-byte swizzle, exactly as
// the producer of cuda/common/kv_producer.cuh loads them, into the shared memory of every SM?
//
// One CTA per SM (the shared-memory request allows no second one); its one thread drives the
// decode kernels' own producer and ring (DecodeKVProducer, KVPipelineBarriers, KVConsumer of
// cuda/common/kv_producer.cuh: block-table lookup, per-box full barriers, empty barriers) with
// `stages` stages, and plays the consumer by releasing a stage as soon as all its boxes landed, so
// `stages` tiles are in flight per SM all the time. Pages of 64 tokens come from a (tiles * 64, 576)
// buffer of `ws` MB: a small buffer stays L2-resident after the first pass, a large one streams
// from DRAM. `share` consecutive CTAs walk the same block table at the same time, as the two row
// blocks of h_q = 128 do (2): one of them reads DRAM, the other finds the tile in L2. The block
// tables are a fixed pseudo-random permutation (paged caches scatter pages); the tables of
// different groups do not overlap while groups x tiles per CTA <= tiles in the working set.
//
// Contention mode (`mma` = 1 or 2 warpgroups, stages <= 2): besides the producer, warpgroup 1 runs
// the decode consumers' heaviest shared-memory reader the whole time, Q K^T as 36 wgmma m64n64k16
// with both operands in shared memory (a 72 KB region outside the ring), and with mma = 2
// warpgroup 2 runs P V-like groups (m64n256k16, both operands in shared memory), so the TMA writes
// compete with wgmma operand reads for the SM's shared-memory bandwidth as they do in the decode
// kernel. The table then also gives the tensor rate reached (MACs per SM clock, from the MAC count
// and the clock64 span of each warpgroup; 2048 is the dense bf16 peak).
//
// Hold mode (`hold` clocks > 0): each stage is released only `hold` clocks after its last box landed,
// as the decode consumers keep a stage through S, the softmax and both P V; with two stages the
// time per tile is then the hold plus the release-to-landed latency of a reload (~5000 clocks from
// acquire to last box ready in the SM90 kernel on b128/4K, docs/performance.md).
//
// Copy mode (`copy` = boxes per TMA copy: 1, 3 or 9): 1 loads each tile as 9 copies of one (64, 64)
// box, each completing its own barrier, as the SM100 kernel does (the producer's nine issues took
// ~2700 clocks in the SM90 kernel while the previous tile's copies were in flight). With copy = 3 or
// 9 the same bytes come as 3 or 1 copies of a 3-D view of the cache (tensor_map.h
// make_tensor_map_col_boxes) into the same shared-memory layout, as the SM90 kernel's grouped copies
// (3) do: does the SM's load path go faster with fewer, larger copies?
//
// Prints, per configuration, the median time of one kernel over `reps` runs, the bytes landed in
// shared memory per second (the L2 -> SM rate) and the same divided by `share` (what DRAM supplies
// when the other sharers find each tile in L2). docs/performance.md (2026-12-03) says why.
//
// Build and run on the GPU machine (compile only here):
//   nvcc -std=c++17 -O2 -gencode arch=compute_90a,code=sm_90a -I cuda benchmarks/tma_bandwidth.cu cuda/common/tensor_map.cu \
//        -o /tmp/tma_bandwidth && /tmp/tma_bandwidth            # the default sweep
//   /tmp/tma_bandwidth WS_MB STAGES SHARE [TILES_PER_CTA] [REPS] [MMA_WGS] [HOLD_CLOCKS] [COPY]  # one configuration
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda.h>
#include <cuda_runtime.h>

#include "check_cuda.h"

#include "common/kv_producer.cuh"
#include "common/ptx.cuh"
#include "common/tensor_map.h"
#include "sm90/wgmma.cuh"

namespace {

using jax_mla::kBlockN;
using jax_mla::kKvBoxesQK;
using jax_mla::kKvBoxElems;
using jax_mla::kKvTileBytes;

constexpr int kMaxStages = 3;  // 3 x 72 KB: what one SM's shared memory holds
constexpr int kMaxMmaWarpgroups = 2;
constexpr int kMmaRegionBytes = kKvTileBytes;  // (9 boxes, 64, 64): Q-like and K-like operands
constexpr int kLog2PageSize = 6;  // pages of kBlockN tokens: one TMA copy per box
static_assert((1 << kLog2PageSize) == kBlockN);

template <int kStages>
struct alignas(1024) Ring {
  uint16_t kv[kStages][kKvBoxesQK][kKvBoxElems];  // (stage, box, BLK_N, 64)
  jax_mla::KVPipelineBarriers<kStages> bars;
};

// Page of step t for CTA group g: a multiplicative permutation of [0, tiles) (odd multiplier,
// tiles a power of two), offset per group so the groups do not read in lock step.
uint32_t tile_of(uint32_t g, uint32_t t, uint32_t tiles, uint32_t tiles_per_cta) {
  return ((g * tiles_per_cta + t) * 2654435761u) & (tiles - 1);
}

// Bytes of dynamic shared memory: the ring, then (contention mode) the 1024-aligned MMA region.
template <int kStages>
__host__ __device__ constexpr int mma_region_offset() {
  return (static_cast<int>(sizeof(Ring<kStages>)) + 1023) / 1024 * 1024;
}

// True in every thread of the warpgroup if `pred` holds in any (bar.red.or over the warpgroup's
// own named barrier): the loop below must leave in all four warps at once, since wgmma is
// .sync.aligned over the warpgroup (a warp left behind is an illegal instruction).
__device__ __forceinline__ bool warpgroup_any(int barrier_id, bool pred) {
  uint32_t out;
  asm volatile(
      "{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n bar.red.or.pred q, %2, 128, p;\n selp.u32 %0, 1, 0, q;\n}"
      : "=r"(out)
      : "r"(static_cast<uint32_t>(pred)), "r"(barrier_id)
      : "memory");
  return out != 0;
}

// One contention warpgroup until the producer sets `*done`. Kind 0 runs Q K^T-like groups (36 wgmma
// m64n64k16, A and B K-major from the region: 128 bytes of operands per tensor clock at full
// rate); kind 1 runs P V-like groups (4 wgmma m64n256k16, A = a (64, 64) box K-major, B = four
// boxes MN-major: the non-owner's P V of the decode kernel). stats: (MACs, clocks summed over
// warpgroups), one elected thread each.
template <int kKind>
__device__ __forceinline__ void contend(uint32_t region, int barrier_id, volatile int* done,
                                        unsigned long long* stats) {
  using namespace jax_mla::sm90;
  constexpr int kAcc = kKind == 0 ? 32 : 128;
  constexpr unsigned long long kMacsPerGroup = kKind == 0 ? 36ull * 64 * 64 * 16 : 4ull * 64 * 256 * 16;
  float acc[kAcc];
  zero_accumulator(acc);
  uint32_t n = 0;
  const long long t0 = clock64();
  while (!warpgroup_any(barrier_id, *done != 0)) {
    wgmma_fence();
    if constexpr (kKind == 0) {
#pragma unroll
      for (int box = 0; box < kKvBoxesQK; ++box) {
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
          const uint32_t off = box * jax_mla::kKvBoxBytes + kk * 32;
          wgmma_m64n64k16_ss<__nv_bfloat16>(acc, desc_k_major(region + off), desc_k_major(region + off), 1);
        }
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {  // 16 tokens per step: 2 KB further in the MN-major boxes
        wgmma_m64n256k16_ss<__nv_bfloat16>(acc, desc_k_major(region + 8 * jax_mla::kKvBoxBytes + kk * 32),
                                           desc_mn_major(region + kk * 2048, jax_mla::kKvBoxBytes), 1);
      }
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(acc);
    ++n;
  }
  const long long t1 = clock64();
  if (threadIdx.x % 128 == 0) {
    atomicAdd(&stats[0], n * kMacsPerGroup);
    atomicAdd(&stats[1], static_cast<unsigned long long>(t1 - t0));
  }
  if (acc[0] == 12345.f) atomicAdd(&stats[0], 1ull);  // keeps the MMAs live
}

template <int kStages>
__global__ void __launch_bounds__(128 * (1 + kMaxMmaWarpgroups), 1)
    stream_tiles(const __grid_constant__ CUtensorMap map, const __grid_constant__ CUtensorMap col_box_map, int share,
                 uint32_t tiles, uint32_t tiles_per_cta, const int32_t* tables, uint32_t* sink,
                 unsigned long long* mma_stats, int hold_clocks, int boxes_per_copy) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  namespace ptx = jax_mla::ptx;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* base = static_cast<uint8_t*>(ptx::align_dynamic_smem<1024>(smem_raw));
  auto& ring = *reinterpret_cast<Ring<kStages>*>(base);
  __shared__ int done;
  if (threadIdx.x == 0) {
    done = 0;
    ring.bars.init(1);
    ptx::fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x >= 128) {  // contention warpgroups (blockDim.x > 128 only with stages <= 2)
    if constexpr (kStages <= 2) {
      // Warpgroup 1: Q K^T-like; warpgroup 2 (mma = 2): P V-like, as the decode kernel's two consumers.
      const uint32_t region = ptx::smem_addr(base + mma_region_offset<kStages>());
      if (threadIdx.x < 256) {
        contend<0>(region, 1, &done, mma_stats);
      } else {
        contend<1>(region, 2, &done, mma_stats);
      }
    }
    return;
  }
  if (threadIdx.x != 0) return;
  jax_mla::DecodeKVProducer<uint16_t, kStages> producer{&ring.bars, &ring.kv[0][0][0], {}};
  const jax_mla::KVConsumer<kStages> consumer{&ring.bars};
  jax_mla::PipelineState<kStages> next_landed;  // the oldest tile in flight
  const int group = static_cast<int>(blockIdx.x) / share;
  const jax_mla::PagedKV kv{&map,
                            tables + static_cast<int64_t>(group) * tiles_per_cta,
                            static_cast<int>(tiles_per_cta) * kBlockN,
                            kBlockN,
                            kLog2PageSize,
                            static_cast<int>(tiles),
                            static_cast<int>(tiles_per_cta),
                            static_cast<int>(tiles) * kBlockN};
  // "Consumes" the oldest tile: waits for all its boxes, then releases its stage.
  auto consume = [&] {
    for (int box = 0; box < kKvBoxesQK; ++box) consumer.wait_box(next_landed, box);
    // Hold mode: keep the landed stage for hold_clocks, as the decode consumers do (S, softmax and
    // both P V of the tile run between its landing and its release), then release it.
    if (hold_clocks > 0) {
      const long long until = clock64() + hold_clocks;
      while (clock64() < until) {
      }
    }
    consumer.release(next_landed);
    next_landed.advance();
  };
  for (uint32_t t = 0; t < tiles_per_cta; ++t) {
    if (t >= static_cast<uint32_t>(kStages)) consume();
    const auto source = producer.locate_tile(kv, static_cast<int>(t) * kBlockN);
    producer.acquire();
    if (boxes_per_copy == 1) {
      producer.load_tile(kv, source);
    } else {
      // Copy mode: box b of a group of boxes_per_copy lands on the group's first box's barrier,
      // which expects the group's bytes; the other boxes' barriers get a plain arrival, so a
      // consumer waiting on every box waits for every copy. Pages of 64 tokens: one cache row.
      uint16_t* dst = producer.stage_ptr(producer.state.stage);
      for (int box = 0; box < kKvBoxesQK; ++box) {
        uint64_t* bar = &ring.bars.full[producer.state.stage][box];
        if (box % boxes_per_copy == 0) {
          ptx::mbarrier_arrive_expect_tx(bar, boxes_per_copy * jax_mla::kKvBoxBytes);
          ptx::tma_load_3d(dst + box * kKvBoxElems, &col_box_map, bar, 0, source.rows[0], box);
        } else {
          ptx::mbarrier_arrive(bar);
        }
      }
    }
    producer.commit_step();
  }
  for (uint32_t t = 0; t < tiles_per_cta && t < static_cast<uint32_t>(kStages); ++t) consume();
  *static_cast<volatile int*>(&done) = 1;
  atomicAdd(sink, ring.kv[0][0][0]);  // keep the loads observable
#endif
}

// Layout check of copy mode: tile `row0 / 64` loaded once as 9 copies of the 2-D map and once as
// 9 / boxes_per_copy copies of the 3-D view, into two regions of shared memory; counts the 16-bit
// elements that differ (must be 0: the same bytes in the same swizzled places).
__global__ void check_col_boxes(const __grid_constant__ CUtensorMap map, const __grid_constant__ CUtensorMap col_box_map,
                                int row0, int boxes_per_copy, unsigned long long* mismatches) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  namespace ptx = jax_mla::ptx;
  extern __shared__ uint8_t smem_raw[];
  auto* base = reinterpret_cast<uint16_t*>(ptx::align_dynamic_smem<1024>(smem_raw));
  uint16_t* a = base;                              // (9 boxes, 64, 64) from the 2-D map
  uint16_t* b = base + kKvBoxesQK * kKvBoxElems;  // the same from the 3-D view
  __shared__ uint64_t bar;
  if (threadIdx.x == 0) {
    ptx::mbarrier_init(&bar, 1);
    ptx::fence_barrier_init();
    ptx::mbarrier_arrive_expect_tx(&bar, 2 * jax_mla::kKvTileBytes);
    for (int box = 0; box < kKvBoxesQK; ++box) {
      ptx::tma_load_2d(a + box * kKvBoxElems, &map, &bar, box * jax_mla::kKvBoxCols, row0);
      if (box % boxes_per_copy == 0) ptx::tma_load_3d(b + box * kKvBoxElems, &col_box_map, &bar, 0, row0, box);
    }
  }
  __syncthreads();
  ptx::mbarrier_wait(&bar, 0);
  unsigned long long bad = 0;
  for (int i = threadIdx.x; i < kKvBoxesQK * kKvBoxElems; i += blockDim.x) bad += a[i] != b[i];
  atomicAdd(mismatches, bad);
#endif
}

// Fills the buffer with distinct-looking 16-bit values (the sweep itself runs on zeros).
__global__ void fill_pattern(uint16_t* buf, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    buf[i] = static_cast<uint16_t>((i * 2654435761ull) >> 13);
  }
}

struct Result {
  double us, gbps_sm, gbps_unshared, macs_per_clock;
};

using Kernel = void (*)(CUtensorMap, CUtensorMap, int, uint32_t, uint32_t, const int32_t*, uint32_t*, unsigned long long*,
                        int, int);

Kernel kernel_for(int stages) {
  switch (stages) {
    case 1: return stream_tiles<1>;
    case 2: return stream_tiles<2>;
    default: return stream_tiles<3>;
  }
}

// The cache of `tiles` tiles as the kernels' 2-D map (boxes of (64, 64)) and as the column-box view
// with `copy` boxes per copy; exits on failure.
void make_maps(void* buf, uint32_t tiles, int copy, CUtensorMap* map, CUtensorMap* col_box_map) {
  const char* err = nullptr;
  if (!jax_mla::make_tensor_map_2d(map, buf, jax_mla::DType::kBF16, uint64_t(tiles) * kBlockN, 576, 576, kBlockN,
                                   jax_mla::kKvBoxCols, &err) ||
      !jax_mla::make_tensor_map_col_boxes(col_box_map, buf, jax_mla::DType::kBF16, uint64_t(tiles) * kBlockN, 576,
                                          576, kBlockN, static_cast<uint32_t>(copy), &err)) {
    std::fprintf(stderr, "tensor map: %s\n", err);
    std::exit(1);
  }
}

Result run(void* buf, uint32_t tiles, int stages, int share, uint32_t tiles_per_cta, int reps, int ctas, int mma,
           int hold, int copy, uint32_t* sink, unsigned long long* mma_stats) {
  CUtensorMap map, col_box_map;
  make_maps(buf, tiles, copy, &map, &col_box_map);
  // One block table per sharing group.
  const int groups = (ctas + share - 1) / share;
  std::vector<int32_t> host(static_cast<size_t>(groups) * tiles_per_cta);
  for (int g = 0; g < groups; ++g)
    for (uint32_t t = 0; t < tiles_per_cta; ++t) host[size_t(g) * tiles_per_cta + t] = tile_of(g, t, tiles, tiles_per_cta);
  int32_t* tables = nullptr;
  CHECK_CUDA(cudaMalloc(&tables, host.size() * sizeof(int32_t)));
  CHECK_CUDA(cudaMemcpy(tables, host.data(), host.size() * sizeof(int32_t), cudaMemcpyHostToDevice));

  const Kernel kernel = kernel_for(stages);
  // Always the largest request (one CTA per SM): 3 stages, or 2 stages and the MMA region.
  const int smem = std::max(static_cast<int>(sizeof(Ring<kMaxStages>)), mma_region_offset<2>() + kMmaRegionBytes) + 1024;
  CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  std::vector<float> ms;
  std::vector<double> rate;  // MACs per SM clock of the contention warpgroups, per run
  for (int r = 0; r < reps + 2; ++r) {  // 2 warm-up runs (the first also fills L2 for small sets)
    CHECK_CUDA(cudaMemset(mma_stats, 0, 2 * sizeof(unsigned long long)));
    CHECK_CUDA(cudaEventRecord(a));
    kernel<<<ctas, 128 * (1 + mma), smem>>>(map, col_box_map, share, tiles, tiles_per_cta, tables, sink, mma_stats, hold,
                                            copy);
    CHECK_CUDA(cudaEventRecord(b));
    CHECK_CUDA(cudaEventSynchronize(b));
    CHECK_CUDA(cudaGetLastError());
    float m = 0.f;
    CHECK_CUDA(cudaEventElapsedTime(&m, a, b));
    unsigned long long st[2];
    CHECK_CUDA(cudaMemcpy(st, mma_stats, sizeof(st), cudaMemcpyDeviceToHost));
    if (r >= 2) {
      ms.push_back(m);
      // All contention MACs over the mean clocks of one warpgroup, per SM.
      if (mma > 0 && st[1] > 0) rate.push_back(double(st[0]) / (double(st[1]) / (ctas * mma)) / ctas);
    }
  }
  std::sort(rate.begin(), rate.end());
  std::sort(ms.begin(), ms.end());
  const double sec = ms[ms.size() / 2] * 1e-3;
  const double landed = double(ctas) * tiles_per_cta * kKvTileBytes;
  CHECK_CUDA(cudaEventDestroy(a));
  CHECK_CUDA(cudaEventDestroy(b));
  CHECK_CUDA(cudaFree(tables));
  // Unshared: the bytes of one CTA per sharing group, what DRAM supplies when the other sharers
  // find each tile in L2 (for a large working set, where tiles do not repeat).
  return {sec * 1e6, landed / sec * 1e-9, landed / share / sec * 1e-9, rate.empty() ? 0.0 : rate[rate.size() / 2]};
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
  unsigned long long* mma_stats = nullptr;  // (MACs, clocks) summed over contention warpgroups
  CHECK_CUDA(cudaMalloc(&mma_stats, 2 * sizeof(unsigned long long)));

  // Copy mode lands the same bytes in the same places as the kernels' 9 copies: checked on a
  // patterned buffer (tile 5) before the sweep.
  {
    const uint32_t tiles = 64;
    fill_pattern<<<264, 256>>>(static_cast<uint16_t*>(buf), size_t(tiles) * kBlockN * 576);
    CHECK_CUDA(cudaGetLastError());
    const int smem = 2 * jax_mla::kKvTileBytes + 1024;
    CHECK_CUDA(cudaFuncSetAttribute(check_col_boxes, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    for (int copy : {3, 9}) {
      CUtensorMap map, col_box_map;
      make_maps(buf, tiles, copy, &map, &col_box_map);
      CHECK_CUDA(cudaMemset(mma_stats, 0, sizeof(unsigned long long)));
      check_col_boxes<<<1, 128, smem>>>(map, col_box_map, 5 * kBlockN, copy, mma_stats);
      CHECK_CUDA(cudaDeviceSynchronize());
      unsigned long long bad = 0;
      CHECK_CUDA(cudaMemcpy(&bad, mma_stats, sizeof(bad), cudaMemcpyDeviceToHost));
      std::printf("# layout check, copy %d: %llu of %d elements differ from the 9 two-dimensional copies\n", copy, bad,
                  kKvBoxesQK * kKvBoxElems);
      if (bad != 0) return 1;
    }
    CHECK_CUDA(cudaMemset(buf, 0, max_ws_mb << 20));
  }

  struct Config {
    uint64_t ws_mb;
    int stages, share, mma, hold;
    int copy = 1;  // boxes per TMA copy
  };
  std::vector<Config> configs;
  // 132 groups x 240 tiles < the 32768 tiles of the 4 GB set: from DRAM, no group re-reads a tile
  // another group read (which could hit L2).
  uint32_t tiles_per_cta = 240;
  int reps = 5;
  if (argc >= 4) {
    configs.push_back({std::strtoull(argv[1], nullptr, 10), std::atoi(argv[2]), std::atoi(argv[3]),
                       argc >= 7 ? std::atoi(argv[6]) : 0, argc >= 8 ? std::atoi(argv[7]) : 0,
                       argc >= 9 ? std::atoi(argv[8]) : 1});
    if (argc >= 5) tiles_per_cta = static_cast<uint32_t>(std::atoi(argv[4]));
    if (argc >= 6) reps = std::atoi(argv[5]);
  } else {
    for (uint64_t ws : {uint64_t(16), max_ws_mb})
      for (int share : {1, 2})
        for (int stages : {1, 2, 3}) configs.push_back({ws, stages, share, 0, 0});
    // The same loads against the decode kernels' S traffic (contention mode), h_q = 128's pattern.
    for (uint64_t ws : {uint64_t(16), max_ws_mb})
      for (int mma : {1, 2}) configs.push_back({ws, 2, 2, mma, 0});
    // The decode kernel's ring timing: two stages from DRAM shared by 2 CTAs, each stage held for
    // `hold` clocks after it landed (b128/4K's consumers hold a stage ~2650 clocks; in the kernel a
    // tile then lands every ~3900 clocks). Per tile: the hold plus the release-to-landed latency.
    for (int hold : {1000, 2000, 2650, 3500}) configs.push_back({max_ws_mb, 2, 2, 0, hold});
    // Fewer, larger copies per tile (copy mode), streaming and with the decode kernel's hold.
    for (int copy : {3, 9}) {
      for (int share : {1, 2})
        for (int stages : {1, 2}) configs.push_back({max_ws_mb, stages, share, 0, 0, copy});
      configs.push_back({max_ws_mb, 2, 2, 0, 2650, copy});
    }
  }
  std::printf("# %d SMs, one CTA each; tiles of 64 x 576 bf16 (%d KB) as 9 TMA boxes; %u tiles per CTA\n", sms,
              kKvTileBytes / 1024, tiles_per_cta);
  std::printf("%8s %7s %6s %4s %6s %5s %10s %14s %14s %10s %12s\n", "ws_MB", "stages", "share", "mma", "hold", "copy",
              "us", "GB/s_into_SMs", "GB/s_unshared", "MAC/clk", "ns_per_tile");
  for (const Config& c : configs) {
    if (c.stages < 1 || c.stages > kMaxStages || c.share < 1 || c.ws_mb > max_ws_mb || c.mma < 0 ||
        c.mma > kMaxMmaWarpgroups || (c.mma > 0 && c.stages > 2) || c.hold < 0 ||
        (c.copy != 1 && c.copy != 3 && c.copy != 9)) {
      std::fprintf(stderr, "bad configuration (stages 1..%d, share >= 1, ws <= %llu MB, mma 0..%d and only with stages <= 2, copy 1, 3 or 9)\n",
                   kMaxStages, static_cast<unsigned long long>(max_ws_mb), kMaxMmaWarpgroups);
      return 2;
    }
    // A power of two of tiles that fits the working set.
    uint32_t tiles = 1;
    while (uint64_t(tiles) * 2 * kKvTileBytes <= (c.ws_mb << 20)) tiles *= 2;
    const Result r = run(buf, tiles, c.stages, c.share, tiles_per_cta, reps, sms, c.mma, c.hold, c.copy, sink, mma_stats);
    std::printf("%8llu %7d %6d %4d %6d %5d %10.1f %14.0f %14.0f %10.0f %12.0f\n", static_cast<unsigned long long>(c.ws_mb),
                c.stages, c.share, c.mma, c.hold, c.copy, r.us, r.gbps_sm, r.gbps_unshared, r.macs_per_clock,
                r.us * 1e3 / tiles_per_cta);
  }
  CHECK_CUDA(cudaFree(buf));
  CHECK_CUDA(cudaFree(sink));
  CHECK_CUDA(cudaFree(mma_stats));
  return 0;
}
