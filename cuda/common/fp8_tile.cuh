// One KV tile of the FP8 cache (config.h, kFp8*) in the ring of 16-bit boxes that the SM90 and SM100
// kernels read, shared by both (sm90/fp8_tiles.cuh, sm100/fp8_tiles.cuh walk their own rings):
//   load_fp8_tile     the producer thread: the tile's raw bytes by TMA into the tile's own boxes
//   dequantize_tile   the dequantizing warps: those bytes rewritten in place as the 16-bit boxes
// Each ring says where a tile's box b and its full barrier are (callables box(b), full(b)).
//
// Q (72 KB) and two 72 KB tiles leave no room for a staging buffer, and none is needed: a pair of V
// boxes (128 columns) is one scale tile, and its e4m3 bytes, (64 tokens, 128 bytes), are exactly
// one box. Pair k's bytes land in box kFp8RawFirstBox + k, the scales beside the ring (Fp8Staging),
// the RoPE values (bf16) straight into box 8. Rows are the unit of the rewrite: a row's raw bytes are
// read only by the warp that writes that row of the outputs, and pair k's outputs (boxes 2k, 2k + 1)
// overwrite only raw pairs <= k, which that warp has already read.
//
// Values are exactly unpack_fp8_kv(row, q's dtype) (common/fp8_convert.cuh): where a row's tile
// scale is +-0 or +-2^k with k in the element type's exact range and no byte is NaN, one PRMT, a
// shift, an AND and one 16-bit multiply per two values; otherwise (one warp vote per step) through
// fp32 as the portable kernel does.
#pragma once

#include <cstdint>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <type_traits>

#include "config.h"
#include "fp8_convert.cuh"
#include "kv_producer.cuh"
#include "ptx.cuh"

namespace jax_mla {

inline constexpr int kFp8RawFirstBox = 4;
static_assert(kFp8TileCols == 2 * kKvBoxCols && kFp8Tiles * 2 == kKvBoxesV, "a pair of V boxes is one FP8 scale tile");
static_assert(kBlockN * kFp8TileCols == kKvBoxBytes, "one tile's e4m3 bytes of a pair fill one 16-bit box");
constexpr bool fp8_outputs_overwrite_only_read_pairs() {
  for (int k = 0; k < kFp8Tiles; ++k) {
    for (int box = 2 * k; box <= 2 * k + 1; ++box) {
      const int raw_pair = box - kFp8RawFirstBox;  // the raw pair whose bytes sit in this box
      if (raw_pair > k && raw_pair < kFp8Tiles) return false;
    }
  }
  return true;
}
static_assert(kFp8RawFirstBox + kFp8Tiles <= kKvBoxesV && fp8_outputs_overwrite_only_read_pairs(),
              "pair k's outputs may overwrite only raw pairs <= k, inside the V boxes");

// Bytes of one tile that complete its raw_full barrier: every byte of the tokens' FP8 rows, once.
inline constexpr int kFp8TileBytes = kBlockN * (kFp8Tiles * kFp8TileCols + 4 * kFp8Tiles + 2 * kHeadDimRope);
static_assert(kFp8TileBytes == kBlockN * kFp8RowBytes);

// Beside the ring, per tile position (kPositions: the ring's tiles).
template <int kPositions>
struct Fp8Staging {
  alignas(128) float scales[kPositions][kBlockN][kFp8Tiles];  // TMA destination: 128-byte aligned (no swizzle)
  uint64_t raw_full[kPositions];  // the position's e4m3 bytes, scales and RoPE box landed (TMA bytes)
};

// The producer thread: arms `raw_full` with kFp8TileBytes and issues the tile's copies into its
// boxes (box(b): the address of the tile's box b) and `scales` (the position's). Per page chunk of
// the tile (one for pages of >= 64 tokens): the four pairs' e4m3 bytes, (rows, 128) bytes each
// (kv.map: the cache as (tokens, 656) bytes, box (rows, 128)); the rows' scales, (rows, 16) bytes
// (scale_map); the RoPE values as bf16 with the 128-byte swizzle (rope_map: the cache as (tokens,
// 328) bf16, box (rows, 64)). Tokens past the cache's end are zero-filled by TMA and count their
// bytes: the barrier always gets a whole tile.
template <typename BoxAddress>
__device__ __forceinline__ void load_fp8_tile(BoxAddress box, float (*scales)[kFp8Tiles], uint64_t* raw_full,
                                              const PagedKV& kv, const TileSource& t, const CUtensorMap* scale_map,
                                              const CUtensorMap* rope_map) {
  ptx::mbarrier_arrive_expect_tx(raw_full, kFp8TileBytes);
  // Unrolled over the most page chunks a tile has (as copy_box), so t.rows stays in registers.
#pragma unroll
  for (int c = 0; c < kBlockN / kMinGpuPageSize; ++c) {
    if (c >= t.copies) break;
    const int first_row = c * t.box_rows;  // of the tile
#pragma unroll
    for (int pair = 0; pair < kFp8Tiles; ++pair) {
      ptx::tma_load_2d(box(kFp8RawFirstBox + pair) + first_row * kFp8TileCols, kv.map, raw_full,
                       pair * kFp8TileCols, t.rows[c]);
    }
    ptx::tma_load_2d(&scales[first_row][0], scale_map, raw_full, kFp8ScalesOffset, t.rows[c]);
    ptx::tma_load_2d(box(kKvRopeBox) + first_row * (kKvBoxCols * 2), rope_map, raw_full, kFp8RopeOffset / 2,
                     t.rows[c]);
  }
}

// A tile's rows in groups of 4 (8 lanes a row, 16 e4m3 bytes a lane).
inline constexpr int kFp8RowsPerGroup = 32 / (kFp8TileCols / 16);  // 4
inline constexpr int kFp8Groups = kBlockN / kFp8RowsPerGroup;       // 16

// One lane's 16 bytes of one row of one pair, and the row's scale (as bits).
struct RawChunk {
  uint4 bytes;
  uint32_t scale_bits;
};

// One chunk: on the fast path when every lane's scale allows it and no byte of its 16 is NaN (one
// warp vote), else through fp32.
template <typename Element>
__device__ __forceinline__ void dequantize_chunk(const RawChunk& in, uint4 out[2]) {
  uint32_t factor2;
  const bool fast = fp8_fast_factor<Element>(in.scale_bits, &factor2) &&
                    (e4m3_nan_bytes(in.bytes.x) | e4m3_nan_bytes(in.bytes.y) | e4m3_nan_bytes(in.bytes.z) |
                     e4m3_nan_bytes(in.bytes.w)) == 0;
  if (__all_sync(0xffffffffu, fast)) {
    e4m3x16_to_scaled<Element>(in.bytes, factor2, out);
  } else {
    const float scale = __uint_as_float(in.scale_bits);
    out[0] = dequantize_e4m3x8<Element>(make_uint2(in.bytes.x, in.bytes.y), scale);
    out[1] = dequantize_e4m3x8<Element>(make_uint2(in.bytes.z, in.bytes.w), scale);
  }
}

// One dequantizing warp's share of a landed tile (after its raw_full wait): groups j with
// (j + tile_count) % kWarps == warp, pair by pair, one group a step; the next step's loads go
// before this step's stores (they read other rows, or the next pair's raw box, which no output of
// this pair overwrites). After its rows of a pair the warp fences for the async proxy (the tensor
// core reads the boxes through it) and arrives once on each of the pair's two full barriers, so a
// box is complete after kWarps arrivals. The RoPE box: with bf16 q an arrival at once (it landed as
// it is used), with fp16 q rounded in place first.
// box(b): the address of the tile's box b; full(b): its full barrier.
template <typename Element, int kWarps, typename BoxAddress, typename FullBarrier>
__device__ __forceinline__ void dequantize_tile(BoxAddress box, FullBarrier full, const float (*scales)[kFp8Tiles],
                                                int warp, int tile_count) {
  const int lane = threadIdx.x % 32;
  const int chunk = lane % 8;             // bytes 16 chunk .. +15 of the row's pair: columns of the pair
  const int row_in_group = lane / 8;
  const int out_box = chunk / 4;          // 0: box 2k, 1: box 2k + 1
  const int out_chunk = 2 * (chunk % 4);  // the first of the two 16-byte chunks (8 values each) it writes
  // A row's 8 lanes store in one phase of a 128-bit store: lanes 0-3 to box 2k and lanes 4-7 to box
  // 2k + 1 (8 KB apart, the same banks) would hit the same chunk positions. So lanes 4-7 convert
  // their two halves in the other order and store the odd chunk first: each store covers all 8
  // chunk positions of the row once.
  const bool swap_halves = out_box == 1;
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
    if (lane == 0) ptx::mbarrier_arrive(full(kKvRopeBox));
  }
  const int first_group = (warp - tile_count % kWarps + kWarps) % kWarps;
  const auto load = [&](int pair, int row) {
    RawChunk r;
    r.bytes = *reinterpret_cast<const uint4*>(box(kFp8RawFirstBox + pair) + row * kFp8TileCols + chunk * 16);
    r.scale_bits = __float_as_uint(scales[row][pair]);
    return r;
  };
  int pair = 0;
  int row = first_group * kFp8RowsPerGroup + row_in_group;
  RawChunk next = load(pair, row);
#pragma unroll 1
  for (;;) {
    uint4 out[2];
    if (swap_halves) next.bytes = make_uint4(next.bytes.z, next.bytes.w, next.bytes.x, next.bytes.y);
    dequantize_chunk<Element>(next, out);
    int next_pair = pair;
    int next_row = row + kWarps * kFp8RowsPerGroup;
    if (next_row >= kBlockN) {
      next_row = first_group * kFp8RowsPerGroup + row_in_group;
      ++next_pair;
    }
    if (next_pair < kFp8Tiles) next = load(next_pair, next_row);
    __syncwarp();  // every lane of these rows has read its raw bytes before any lane overwrites them
    uint4* dst = reinterpret_cast<uint4*>(box(2 * pair + out_box) + row * (kKvBoxCols * 2));
    // The 128-byte swizzle: 16-byte chunk index ^ (row % 8). out[0] holds this lane's first
    // (swap_halves: second) 8 values.
    dst[(out_chunk + swap_halves) ^ (row & 7)] = out[0];
    dst[(out_chunk + !swap_halves) ^ (row & 7)] = out[1];
    if (next_pair != pair) {
      // This warp's rows of the pair are written: visible to the tensor core (async proxy), then
      // one arrival per box.
      ptx::fence_proxy_async_smem();
      __syncwarp();
      if (lane == 0) {
        ptx::mbarrier_arrive(full(2 * pair));
        ptx::mbarrier_arrive(full(2 * pair + 1));
      }
      if (next_pair == kFp8Tiles) break;
    }
    pair = next_pair;
    row = next_row;
  }
  if constexpr (std::is_same_v<Element, __half>) {
    // The RoPE box as fp16: each lane rounds a 16-byte chunk of its rows in place (any chunk order:
    // the rounding is per value).
    uint4* rope = reinterpret_cast<uint4*>(box(kKvRopeBox));
#pragma unroll 1
    for (int g = first_group; g < kFp8Groups; g += kWarps) {
      uint4* p = rope + (g * kFp8RowsPerGroup + row_in_group) * 8 + chunk;
      *p = rope_bf16x8_to<Element>(*p);
    }
    ptx::fence_proxy_async_smem();
    __syncwarp();
    if (lane == 0) ptx::mbarrier_arrive(full(kKvRopeBox));
  }
}

}  // namespace jax_mla
