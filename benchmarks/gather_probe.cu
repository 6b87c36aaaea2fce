// The ceiling of the sparse decode's gather, measured without the MMAs: how fast can warps of one CTA
// per SM gather one-token FP8 rows (656 bytes at random cache slots) by cp.async into the decode
// kernels' tile layout, and, with the dequantizing warps, turn them into 16-bit boxes?
//
// Why: on an H100 the SM90 kernel takes ~10-14 us per gathered 64-token tile per CTA against ~2.4-3.8
// for a TMA tile of the dense decode, with DRAM at 7.5-14% and SM throughput at 13-14% (ncu,
// docs/performance.md): latency-bound. This probe times the gather chain alone, so that one run
// says whether the gather is the bound and which change moves it: more gathering warps, more tiles
// in flight, the .L2::256B hint, prefetching rows into L2 tiles ahead.
//
// One CTA per SM (the shared-memory request allows no second one), three roles:
//   gathering warps (G = 1, 2 or 4): walk `tiles` tiles of 64 tokens; per tile wait for a free ring
//     position (its empty barrier), then copy the tile's rows into it. G = 1 without hint or prefetch
//     runs the shipped code (common/fp8_tile.cuh locate_gathered_tile + gather_fp8_tile); otherwise a
//     probe copy of the same loop over each warp's share of the tokens (64 / G), optionally with the
//     .L2::256B prefetch-size hint on every cp.async and prefetch.global.L2 of the rows `ahead`
//     tiles ahead (issued before the wait for a free position). `transport` picks how the probe's
//     copy moves a row: 0 cp.async (16 bytes a lane, as shipped), 1 per-row bulk copies through the
//     TMA unit (cp.async.bulk: 4 pair chunks of 128 bytes, the scales, the RoPE values unswizzled:
//     6 copies a row, completing raw_full's transaction count; the issue's "per-row bulk copies"),
//     2 loads into registers (ld.global.nc, 16 bytes a lane, 8 tokens in flight) stored to shared
//     memory (FlashMLA's sparse producer moves rows so);
//   fused (ebcdb2c's warpgroup 0): 4 gathering warps of which warps 1-3 are also the dequantizing
//     ones, per tile the rewrite of the previous tile and then their copies of this one;
//   dequantizing warps (D = 0 or 3): as the SM90 kernel's warps 1-3, wait for the tile's raw_full
//     and rewrite it in place as 16-bit boxes (common/fp8_tile.cuh dequantize_tile, bf16), arriving
//     on the boxes' full barriers;
//   one consumer warp: waits for the tile (its 9 full barriers, or raw_full when D = 0), holds it
//     `hold` clocks (the decode consumers keep a tile through S, the softmax and both P V), then
//     releases its position.
// The ring has `positions` tile positions of 72 KB (1-3; the SM90 kernel has 2 beside Q's 72 KB).
// Slots: uniform random over a cache of `ws` MB (order 0: a decode over top-k selected tokens of long
// contexts misses L2), or consecutive (order 1: the dense decode's access pattern, through the same
// gather).
//
// Prints, per configuration, the median kernel time over `reps` runs, ns per tile per CTA and the
// rate of gathered bytes (656 a token) over all SMs.
//
// Build and run on the GPU machine (compile only here):
//   nvcc -std=c++17 -O2 -gencode arch=compute_90a,code=sm_90a -I cuda benchmarks/gather_probe.cu -o /tmp/gather_probe
//   /tmp/gather_probe                        # the default sweep
//   /tmp/gather_probe WS_MB TILES POSITIONS GATHER_WARPS DEQUANT_WARPS HOLD ORDER AHEAD L2_256 TRANSPORT FUSED [REPS]
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "check_cuda.h"

#include "common/config.h"
#include "common/fp8_tile.cuh"
#include "common/kv_producer.cuh"
#include "common/ptx.cuh"

namespace {

using jax_mla::kBlockN;
using jax_mla::kFp8RowBytes;
using jax_mla::kFp8Tiles;
using jax_mla::kKvBoxBytes;
using jax_mla::kKvBoxesQK;
namespace ptx = jax_mla::ptx;

constexpr int kMaxPositions = 3;  // 3 x 72 KB: what one SM's shared memory holds
constexpr int kMaxGatherWarps = 4;

template <int kPositions>
struct alignas(1024) Ring {
  uint8_t tiles[kPositions][kKvBoxesQK][kKvBoxBytes];  // (position, box, 64 rows, 128 bytes)
  jax_mla::Fp8Staging<kPositions> fp8;                 // scales and raw_full per position
  uint64_t full[kPositions][kKvBoxesQK];               // dequantizing warps -> consumer
  uint64_t empty[kPositions];                          // consumer -> gathering warps
};

struct Config {
  int ws_mb = 2048, tiles = 64, positions = 2, gather_warps = 1, dequant_warps = 3, hold = 0, order = 0,
      ahead = 0, l2_256 = 0, transport = 0, fused = 0, reps = 7;
};

enum Transport : int { kCpAsync = 0, kBulk = 1, kRegisters = 2 };

__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// cp.async where pred holds (one predicated instruction), with or without the .L2::256B hint.
template <bool kL2_256>
__device__ __forceinline__ void copy_if(bool pred, uint32_t dst, const void* src) {
  if constexpr (kL2_256) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.u32 p, %0, 0;\n @p cp.async.cg.shared.global.L2::256B [%1], [%2], 16;\n}" ::"r"(
            static_cast<uint32_t>(pred)),
        "r"(dst), "l"(src)
        : "memory");
  } else {
    ptx::cp_async_16_if(pred, dst, src, 16);
  }
}

// A probe copy of gather_fp8_tile for warp `w` of `warps`: tokens [64 w / warps, 64 (w + 1) / warps)
// of the tile whose slots are `slots` (64 int32), with or without the .L2::256B hint; the same lane
// map and branch-free side copies.
template <bool kL2_256>
__device__ __forceinline__ void gather_share(uint8_t (*tile)[kKvBoxBytes], float (*scales)[kFp8Tiles],
                                             uint64_t* raw_full, const uint8_t* cache, const int32_t* slots,
                                             int w, int warps) {
  const int lane = threadIdx.x % 32;
  const int count = kBlockN / warps, first = w * count;
  const int my_slot = lane < count ? slots[first + lane] : 0;
  const uint32_t pair_dst = ptx::smem_addr(tile[jax_mla::kFp8RawFirstBox + lane / 8]) + (lane % 8) * 16;
  const bool side = lane <= 8;
  const int rope_chunk = lane > 0 ? lane - 1 : 0;
  const uint32_t scales_dst = ptx::smem_addr(&scales[0][0]);
  const uint32_t rope_dst = ptx::smem_addr(tile[jax_mla::kKvRopeBox]);
  const int side_src = lane == 0 ? jax_mla::kFp8ScalesOffset : jax_mla::kFp8RopeOffset + rope_chunk * 16;
#pragma unroll 4
  for (int i = 0; i < count; ++i) {
    const int j = first + i;
    const int slot = __shfl_sync(0xffffffffu, my_slot, i);
    const uint8_t* row = cache + static_cast<int64_t>(slot) * kFp8RowBytes;
    copy_if<kL2_256>(true, pair_dst + j * jax_mla::kFp8TileCols, row + lane * 16);
    const uint32_t side_dst = lane == 0 ? scales_dst + j * 16 : rope_dst + j * 128 + ((rope_chunk ^ (j & 7)) * 16);
    copy_if<kL2_256>(side, side_dst, row + side_src);
  }
  ptx::cp_async_mbarrier_arrive_noinc(raw_full);
}

__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   ptx::smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(ptx::smem_addr(bar))
               : "memory");
}

// Transport 1: warp w's tokens by per-row bulk copies, lane i the rows of tokens first + i (and
// + 32): 4 pair chunks, the scales, the RoPE values (unswizzled: a probe of the transport only).
// Lane 0 arms raw_full with the share's bytes first (one arrival of the warp).
__device__ __forceinline__ void bulk_share(uint8_t (*tile)[kKvBoxBytes], float (*scales)[kFp8Tiles],
                                           uint64_t* raw_full, const uint8_t* cache, const int32_t* slots, int w,
                                           int warps) {
  const int lane = threadIdx.x % 32;
  const int count = kBlockN / warps, first = w * count;
  if (lane == 0) ptx::mbarrier_arrive_expect_tx(raw_full, count * kFp8RowBytes);
  __syncwarp();
  for (int i = lane; i < count; i += 32) {
    const int j = first + i;
    const uint8_t* row = cache + static_cast<int64_t>(slots[j]) * kFp8RowBytes;
#pragma unroll
    for (int pair = 0; pair < kFp8Tiles; ++pair) {
      bulk_copy(tile[jax_mla::kFp8RawFirstBox + pair] + j * jax_mla::kFp8TileCols, row + pair * jax_mla::kFp8TileCols,
                jax_mla::kFp8TileCols, raw_full);
    }
    bulk_copy(&scales[j][0], row + jax_mla::kFp8ScalesOffset, 16, raw_full);
    bulk_copy(tile[jax_mla::kKvRopeBox] + j * 128, row + jax_mla::kFp8RopeOffset, 128, raw_full);
  }
}

__device__ __forceinline__ uint4 ld_nc(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// Transport 2: as gather_share's lane map, but through registers: 8 tokens' chunks loaded, then
// stored; each lane arrives on raw_full after its stores (32 arrivals a warp).
__device__ __forceinline__ void register_share(uint8_t (*tile)[kKvBoxBytes], float (*scales)[kFp8Tiles],
                                               uint64_t* raw_full, const uint8_t* cache, const int32_t* slots, int w,
                                               int warps) {
  constexpr int kInFlight = 8;
  const int lane = threadIdx.x % 32;
  const int count = kBlockN / warps, first = w * count;
  const int my_slot = lane < count ? slots[first + lane] : 0;
  uint8_t* pair_dst = tile[jax_mla::kFp8RawFirstBox + lane / 8] + (lane % 8) * 16;
  uint8_t* rope_dst = tile[jax_mla::kKvRopeBox];
  const int rope_chunk = lane - 1;
  for (int i0 = 0; i0 < count; i0 += kInFlight) {
    uint4 pair_v[kInFlight], side_v[kInFlight];
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) {
      const int slot = __shfl_sync(0xffffffffu, my_slot, (i0 + k) % 32);
      const uint8_t* row = cache + static_cast<int64_t>(slot) * kFp8RowBytes;
      pair_v[k] = ld_nc(row + lane * 16);
      if (lane == 0) {
        side_v[k] = ld_nc(row + jax_mla::kFp8ScalesOffset);
      } else if (rope_chunk < 8) {
        side_v[k] = ld_nc(row + jax_mla::kFp8RopeOffset + rope_chunk * 16);
      }
    }
#pragma unroll
    for (int k = 0; k < kInFlight; ++k) {
      const int j = first + i0 + k;
      *reinterpret_cast<uint4*>(pair_dst + j * jax_mla::kFp8TileCols) = pair_v[k];
      if (lane == 0) {
        *reinterpret_cast<uint4*>(&scales[j][0]) = side_v[k];
      } else if (rope_chunk < 8) {
        *reinterpret_cast<uint4*>(rope_dst + j * 128 + ((rope_chunk ^ (j & 7)) * 16)) = side_v[k];
      }
    }
  }
  ptx::mbarrier_arrive(raw_full);
}

template <int kPositions, int kDequantWarps, bool kL2_256>
__global__ void __launch_bounds__(32 * (kMaxGatherWarps + 3 + 1), 1)
    gather_tiles(const uint8_t* cache, int num_slots, const int32_t* tables, int tiles, int gather_warps, int hold,
                 int ahead, bool shipped, int transport, bool fused, unsigned* sink) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  extern __shared__ uint8_t smem_raw[];
  auto& ring = *reinterpret_cast<Ring<kPositions>*>(ptx::align_dynamic_smem<1024>(smem_raw));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int p = 0; p < kPositions; ++p) {
      // cp.async and register transports: one arrival per gathering lane; bulk copies: one per warp
      // (its expect_tx) and the bytes.
      ptx::mbarrier_init(&ring.fp8.raw_full[p], transport == kBulk ? gather_warps : 32 * gather_warps);
      for (int b = 0; b < kKvBoxesQK; ++b) ptx::mbarrier_init(&ring.full[p][b], kDequantWarps > 0 ? kDequantWarps : 1);
      ptx::mbarrier_init(&ring.empty[p], 1);
    }
    ptx::fence_barrier_init();
  }
  __syncthreads();
  const int32_t* table = tables + static_cast<int64_t>(blockIdx.x) * tiles * kBlockN;  // (tiles, 64)
  // One gathering warp's work on tile t at ring state st (after the position is free).
  const auto gather = [&](int t, const jax_mla::PipelineState<kPositions>& st, int share) {
    if (transport == kBulk) {
      bulk_share(ring.tiles[st.stage], ring.fp8.scales[st.stage], &ring.fp8.raw_full[st.stage], cache,
                 table + t * kBlockN, share, gather_warps);
    } else if (transport == kRegisters) {
      register_share(ring.tiles[st.stage], ring.fp8.scales[st.stage], &ring.fp8.raw_full[st.stage], cache,
                     table + t * kBlockN, share, gather_warps);
    } else {
      gather_share<kL2_256>(ring.tiles[st.stage], ring.fp8.scales[st.stage], &ring.fp8.raw_full[st.stage], cache,
                            table + t * kBlockN, share, gather_warps);
    }
  };
  // One dequantizing warp's share of tile t (after its raw_full wait).
  const auto rewrite = [&](int t, const jax_mla::PipelineState<kPositions>& st, int dw) {
    if constexpr (kDequantWarps > 0) {
      ptx::mbarrier_wait(&ring.fp8.raw_full[st.stage], st.phase);
      uint8_t(*tile)[kKvBoxBytes] = ring.tiles[st.stage];
      uint64_t* full = ring.full[st.stage];
      jax_mla::dequantize_tile<__nv_bfloat16, kDequantWarps>([&](int b) { return tile[b]; },
                                                            [&](int b) { return &full[b]; },
                                                            ring.fp8.scales[st.stage], dw, t);
    }
  };
  const int consumer_warp = fused ? gather_warps : gather_warps + kDequantWarps;
  if (fused && warp >= 1 && warp < gather_warps) {
    // ebcdb2c's warps 1-3: per tile, the rewrite of the previous tile, then their copies of this one.
    jax_mla::PipelineState<kPositions> st, prev;
    for (int t = 0; t < tiles; ++t) {
      if (t > 0) rewrite(t - 1, prev, warp - 1);
      ptx::mbarrier_wait(&ring.empty[st.stage], st.phase ^ 1);
      gather(t, st, warp);
      prev = st;
      st.advance();
    }
    if (tiles > 0) rewrite(tiles - 1, prev, warp - 1);
  } else if (warp < gather_warps) {
    jax_mla::PipelineState<kPositions> st;
    const jax_mla::PagedKV kv{nullptr, table, tiles * kBlockN, 1, 0, num_slots, tiles * kBlockN, num_slots};
    for (int t = 0; t < tiles; ++t) {
      if (shipped) {  // the SM90 / SM100 producer warp: locate before the wait, then gather
        const jax_mla::GatheredTile located = jax_mla::locate_gathered_tile(kv, t * kBlockN);
        ptx::mbarrier_wait(&ring.empty[st.stage], st.phase ^ 1);
        uint8_t(*tile)[kKvBoxBytes] = ring.tiles[st.stage];
        jax_mla::gather_fp8_tile([&](int b) { return tile[b]; }, &ring.fp8, st.stage, cache, located);
      } else {
        if (ahead > 0 && t + ahead < tiles) {  // this warp's rows of tile t + ahead into L2: 6 lines a row
          const int count = kBlockN / gather_warps;
          const int32_t* later = table + (t + ahead) * kBlockN + warp * count;
          for (int k = lane; k < count * 6; k += 32) {
            prefetch_l2(cache + static_cast<int64_t>(later[k / 6]) * kFp8RowBytes + (k % 6) * 128);
          }
        }
        ptx::mbarrier_wait(&ring.empty[st.stage], st.phase ^ 1);
        gather(t, st, warp);
      }
      st.advance();
    }
  } else if (!fused && warp < gather_warps + kDequantWarps) {
    jax_mla::PipelineState<kPositions> st;
    for (int t = 0; t < tiles; ++t) {
      rewrite(t, st, warp - gather_warps);
      st.advance();
    }
  } else if (warp == consumer_warp) {
    jax_mla::PipelineState<kPositions> st;
    unsigned acc = 0;
    for (int t = 0; t < tiles; ++t) {
      if (kDequantWarps > 0) {
        for (int b = 0; b < kKvBoxesQK; ++b) ptx::mbarrier_wait(&ring.full[st.stage][b], st.phase);
      } else {
        ptx::mbarrier_wait(&ring.fp8.raw_full[st.stage], st.phase);
      }
      acc += ring.tiles[st.stage][lane % kKvBoxesQK][lane];  // a read of the landed tile
      if (hold > 0) {
        const long long t0 = clock64();
        while (clock64() - t0 < hold) {
        }
      }
      __syncwarp();
      if (lane == 0) ptx::mbarrier_arrive(&ring.empty[st.stage]);
      st.advance();
    }
    if (acc == 0xFFFFFFFFu) sink[blockIdx.x] = acc;
  }
#endif
}

// A cache of valid rows: e4m3 bytes 0x38 (1.0) and 0x30, scales 1.0 (the dequantization's fast
// path), RoPE values bf16 1.0.
__global__ void fill_cache(uint8_t* cache, int64_t slots) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < slots * kFp8RowBytes;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int c = static_cast<int>(i % kFp8RowBytes);
    uint8_t v;
    if (c < jax_mla::kFp8ScalesOffset) {
      v = (i & 1) ? 0x38 : 0x30;
    } else if (c < jax_mla::kFp8RopeOffset) {
      const int k = (c - jax_mla::kFp8ScalesOffset) % 4;  // 1.0f little-endian: 00 00 80 3F
      v = k == 2 ? 0x80 : k == 3 ? 0x3F : 0;
    } else {
      v = (c % 2) ? 0x3F : 0x80;  // bf16 1.0: 80 3F
    }
    cache[i] = v;
  }
}

template <int kPositions, int kDequantWarps, bool kL2_256>
float run(const Config& c, const uint8_t* cache, int num_slots, const int32_t* tables, unsigned* sink, int sms) {
  auto kernel = gather_tiles<kPositions, kDequantWarps, kL2_256>;
  const int smem = static_cast<int>(sizeof(Ring<kPositions>)) + 1024;
  CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  const bool shipped = c.gather_warps == 1 && c.ahead == 0 && !kL2_256 && c.transport == kCpAsync;
  const int threads = 32 * (c.fused ? c.gather_warps + 1 : c.gather_warps + kDequantWarps + 1);
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int r = 0; r < c.reps + 1; ++r) {  // the first run warms up
    CHECK_CUDA(cudaEventRecord(a));
    kernel<<<sms, threads, smem>>>(cache, num_slots, tables, c.tiles, c.gather_warps, c.hold, c.ahead, shipped,
                                   c.transport, c.fused != 0, sink);
    CHECK_CUDA(cudaEventRecord(b));
    CHECK_CUDA(cudaEventSynchronize(b));
    CHECK_CUDA(cudaGetLastError());
    float t = 0;
    CHECK_CUDA(cudaEventElapsedTime(&t, a, b));
    if (r > 0) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  CHECK_CUDA(cudaEventDestroy(a));
  CHECK_CUDA(cudaEventDestroy(b));
  return ms[ms.size() / 2];
}

template <int kPositions>
float dispatch_dequant(const Config& c, const uint8_t* cache, int n, const int32_t* t, unsigned* s, int sms) {
  if (c.dequant_warps == 0) {
    return c.l2_256 ? run<kPositions, 0, true>(c, cache, n, t, s, sms) : run<kPositions, 0, false>(c, cache, n, t, s, sms);
  }
  return c.l2_256 ? run<kPositions, 3, true>(c, cache, n, t, s, sms) : run<kPositions, 3, false>(c, cache, n, t, s, sms);
}

void measure(const Config& c, int sms) {
  if (c.positions < 1 || c.positions > kMaxPositions || (c.gather_warps != 1 && c.gather_warps != 2 &&
      c.gather_warps != 4) || (c.dequant_warps != 0 && c.dequant_warps != 3) || c.tiles < 1 || c.transport < 0 ||
      c.transport > 2 || (c.transport != kCpAsync && c.l2_256) ||
      (c.fused && (c.gather_warps != 4 || c.dequant_warps != 3 || c.ahead != 0))) {
    std::fprintf(stderr, "bad configuration (positions 1-3, gather warps 1/2/4, dequant warps 0/3, transport 0-2, "
                         "the L2::256B hint with transport 0 only; fused: 4 gathering warps, 3 dequantizing, no "
                         "prefetch)\n");
    std::exit(2);
  }
  const int64_t slots64 = static_cast<int64_t>(c.ws_mb) * (1 << 20) / kFp8RowBytes;
  const int num_slots = static_cast<int>(std::min<int64_t>(slots64, INT32_MAX));
  uint8_t* cache = nullptr;
  CHECK_CUDA(cudaMalloc(&cache, static_cast<size_t>(num_slots) * kFp8RowBytes));
  fill_cache<<<1024, 256>>>(cache, num_slots);
  std::vector<int32_t> host(static_cast<size_t>(sms) * c.tiles * kBlockN);
  uint64_t s = 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i < host.size(); ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    host[i] = c.order == 0 ? static_cast<int32_t>((s >> 33) % static_cast<uint64_t>(num_slots))
                           : static_cast<int32_t>(i % static_cast<size_t>(num_slots));
  }
  int32_t* tables = nullptr;
  unsigned* sink = nullptr;
  CHECK_CUDA(cudaMalloc(&tables, host.size() * 4));
  CHECK_CUDA(cudaMalloc(&sink, sms * 4));
  CHECK_CUDA(cudaMemcpy(tables, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
  float ms = 0;
  switch (c.positions) {
    case 1: ms = dispatch_dequant<1>(c, cache, num_slots, tables, sink, sms); break;
    case 2: ms = dispatch_dequant<2>(c, cache, num_slots, tables, sink, sms); break;
    default: ms = dispatch_dequant<3>(c, cache, num_slots, tables, sink, sms); break;
  }
  const double tiles = static_cast<double>(sms) * c.tiles;
  static const char* kTransports[] = {"cp.async", "bulk", "regs"};
  std::printf("%6d %5d %4d %4d %4d %6d %-6s %4d %4d %-8s %5d | %9.1f %9.0f %8.0f\n", c.ws_mb, c.tiles, c.positions,
              c.gather_warps, c.dequant_warps, c.hold, c.order == 0 ? "random" : "seq", c.ahead, c.l2_256,
              kTransports[c.transport], c.fused,
              ms * 1e3, ms * 1e6 / c.tiles, tiles * kBlockN * kFp8RowBytes / (ms * 1e-3) / 1e9);
  CHECK_CUDA(cudaFree(cache));
  CHECK_CUDA(cudaFree(tables));
  CHECK_CUDA(cudaFree(sink));
}

}  // namespace

int main(int argc, char** argv) {
  int sms = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::printf("gather probe: one CTA per SM (%d SMs), 64-token tiles of 656-byte FP8 rows\n", sms);
  std::printf("%6s %5s %4s %4s %4s %6s %-6s %4s %4s %-8s %5s | %9s %9s %8s\n", "ws_MB", "tiles", "pos", "gw", "dqw",
              "hold", "order", "ahd", "256B", "moves", "fused", "us", "ns/tile", "GB/s");
  if (argc > 1) {
    if (argc < 12) {
      std::fprintf(stderr,
                   "usage: %s WS_MB TILES POSITIONS GATHER_WARPS DEQUANT_WARPS HOLD ORDER AHEAD L2_256 TRANSPORT FUSED "
                   "[REPS]\n",
                   argv[0]);
      return 2;
    }
    Config c;
    int* f[] = {&c.ws_mb, &c.tiles, &c.positions, &c.gather_warps, &c.dequant_warps, &c.hold, &c.order, &c.ahead,
                &c.l2_256, &c.transport, &c.fused, &c.reps};
    for (int i = 1; i < argc && i <= 12; ++i) *f[i - 1] = std::atoi(argv[i]);
    measure(c, sms);
    return 0;
  }
  // The default sweep: the shipped chain (1 gathering warp, 3 dequantizing, 2 positions), then one
  // change at a time; the hold of 2000 clocks stands in for the consumers' work on a tile at h_q 64.
  const Config base;
  std::vector<Config> sweep;
  for (int hold : {0, 2000}) {
    Config c = base;
    c.hold = hold;
    sweep.push_back(c);                                         // shipped
    Config d = c; d.dequant_warps = 0; sweep.push_back(d);      // gather alone
    Config s = c; s.order = 1; sweep.push_back(s);              // consecutive rows
    Config p = c; p.positions = 3; sweep.push_back(p);          // a third tile in flight
    for (int g : {2, 4}) { Config w = c; w.gather_warps = g; sweep.push_back(w); }
    Config h = c; h.l2_256 = 1; sweep.push_back(h);             // .L2::256B
    for (int a : {1, 2}) { Config q = c; q.ahead = a; sweep.push_back(q); }
    Config f = c; f.gather_warps = 4; f.fused = 1; sweep.push_back(f);  // ebcdb2c's warpgroup 0
    for (int t : {kBulk, kRegisters}) {
      for (int g : {1, 4}) { Config m = c; m.transport = t; m.gather_warps = g; sweep.push_back(m); }
    }
  }
  for (const Config& c : sweep) measure(c, sms);
  return 0;
}
