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
// read only by the warp step that writes that row of the outputs, all of them before its first store.
//
// Values are exactly unpack_fp8_kv(row, q's dtype) (common/fp8_convert.cuh): where a row's tile
// scale is +-0 or +-2^k with k in the element type's exact range and no byte is NaN, one PRMT, a
// shift, an AND and one 16-bit multiply per two values; otherwise (one warp vote per step of 4 rows)
// through fp32 as the portable kernel does.
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
static_assert(kFp8RawFirstBox + kFp8Tiles <= kKvBoxesV, "the raw pairs land in V boxes, never in the RoPE box");

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

// Pages of one token (the sparse decode's view, runtime/sparse_launch.h: a token's page is its cache
// slot). TMA copies whole boxes of rows and cannot gather, so a whole warp copies each token's 656
// bytes with cp.async, 16 bytes a lane, into the places load_fp8_tile's tensor copies fill: pair
// k's e4m3 bytes in box kFp8RawFirstBox + k (no swizzle), the scales into `scales`, the RoPE values
// in the RoPE box under the 128-byte swizzle. Tokens past seq_len and slots outside the cache are
// zero-filled (the slot's request is flagged, as locate_tile's ok). Each lane's cp.async completion
// arrives on raw_full, which therefore counts kGatherLanes arrivals and no bytes. cp.async writes
// through the generic proxy: the dequantizing warps' proxy fence, after their raw_full wait and
// before their arrivals, covers the tile for the tensor core (the RoPE box included).
inline constexpr int kGatherLanes = 32;

// A tile of one-token pages as the gathering warp sees it: this lane's tokens first_token + lane and
// + lane + 32, their cache slots (-1: past seq_len, or outside the cache); ok: every token of the
// tile below seq_len has a slot inside the cache (warp-wide, as locate_tile's ok).
struct GatheredTile {
  int slot[kBlockN / 32];
  bool ok;
};
__device__ __forceinline__ GatheredTile locate_gathered_tile(const PagedKV& kv, int first_token) {
  GatheredTile t;
  bool ok = true;
#pragma unroll
  for (int i = 0; i < kBlockN / 32; ++i) {
    const int token = first_token + threadIdx.x % 32 + 32 * i;
    t.slot[i] = -1;
    if (token < kv.seq_len) {
      const int page = token < kv.max_pages ? kv.page_table[token] : -1;
      if (page < 0 || page >= kv.num_pages) {
        ok = false;
      } else {
        t.slot[i] = page;
      }
    }
  }
  t.ok = __all_sync(0xffffffffu, ok);
  return t;
}

// The whole warp: the cp.async copies of a located tile of one-token pages (cache: (slots, 656)
// bytes) into box(b) and the scales of ring position `position` of `staging` (an Fp8Staging), then
// one arrival per lane on that position's raw_full once its copies landed. Lane l: bytes
// 16 l .. 16 l + 15 of the e4m3 values (pair l / 8, chunk l % 8); lane 0 also the scales, lanes 1-8
// the RoPE chunks 0-7.
template <typename BoxAddress, typename Staging>
__device__ __forceinline__ void gather_fp8_tile(BoxAddress box, Staging* staging, int position, const uint8_t* cache,
                                                const GatheredTile& t) {
  const int lane = threadIdx.x % 32;
  const uint32_t pair_dst = ptx::smem_addr(box(kFp8RawFirstBox + lane / 8)) + (lane % 8) * 16;
  // Lanes 0-8 also copy a side chunk of every token: lane 0 its scales, lane 1 + c its RoPE chunk c
  // (at chunk c ^ (j % 8) of RoPE box row j: the 128-byte swizzle). Addresses are selected, not
  // branched on, so the warp never diverges: one predicated cp.async a token.
  const bool side = lane <= 8;
  const int rope_chunk = lane > 0 ? lane - 1 : 0;
  const uint32_t scales_dst = ptx::smem_addr(&staging->scales[position][0][0]);
  const uint32_t rope_dst = ptx::smem_addr(box(kKvRopeBox));
  const int side_src = lane == 0 ? kFp8ScalesOffset : kFp8RopeOffset + rope_chunk * 16;
  // Token j = 32 half + i: its slot is lane i's t.slot[half]. The halves are unrolled so that t.slot
  // is only ever indexed by a constant (a dynamic index would put it in local memory).
#pragma unroll
  for (int half = 0; half < kBlockN / 32; ++half) {
#pragma unroll 4
    for (int i = 0; i < 32; ++i) {
      const int j = 32 * half + i;
      const int slot = __shfl_sync(0xffffffffu, t.slot[half], i);
      const uint32_t bytes = slot >= 0 ? 16u : 0u;
      const uint8_t* row = cache + static_cast<int64_t>(slot >= 0 ? slot : 0) * kFp8RowBytes;
      ptx::cp_async_16_if(true, pair_dst + j * kFp8TileCols, row + lane * 16, bytes);
      const uint32_t side_dst = lane == 0 ? scales_dst + j * (4 * kFp8Tiles)
                                          : rope_dst + j * 128 + ((rope_chunk ^ (j & 7)) * 16);
      ptx::cp_async_16_if(side, side_dst, row + side_src, bytes);
    }
  }
  ptx::cp_async_mbarrier_arrive_noinc(&staging->raw_full[position]);
}
static_assert(kFp8Tiles * kFp8TileCols == 16 * kGatherLanes, "one 16-byte chunk a lane covers a token's e4m3 bytes");
static_assert(kHeadDimRope * 2 == 8 * 16, "eight 16-byte chunks of RoPE values a token");
static_assert(kKvBoxCols * 2 == 128, "a RoPE box row is 128 bytes (eight 16-byte chunks under the swizzle)");

// The rewrite's step: one warp converts kFp8RowsPerStep whole rows (their 4 x 128 e4m3 bytes), each
// lane kFp8ChunksPerLane 16-byte chunks of one row and one pair (64 values under one scale), so the
// scale decode, the NaN vote and the addressing are paid once per 64 values and the four chunks are
// independent work for the scheduler. All of a row's raw bytes are read by its step, before the
// step's first store: the in-place rewrite needs no other ordering than the warp's own.
// (kFp8ChunksPerLane, kFp8RowsPerStep: config.h, where the host model of the steps reads them.)
inline constexpr int kFp8Steps = kBlockN / kFp8RowsPerStep;  // 16 a tile
static_assert(kFp8TileCols / 16 == 2 * kFp8ChunksPerLane, "a lane converts one half of a pair: one output box row");
static_assert(kFp8RowsPerStep == 4, "the lane map below: two row pairs a step");

// One dequantizing warp's share of a landed tile (after its raw_full wait): steps j (rows 4j .. 4j + 3)
// with (j + tile_count) % kWarps == warp. After its last step the warp fences for the async proxy (the
// tensor core reads the boxes through it) and arrives once on each V box's full barrier, so a box is
// complete after kWarps arrivals. The RoPE box: with bf16 q an arrival with the V boxes' (it landed
// as it is used), with fp16 q rounded in place first.
// box(b): the address of the tile's box b; full(b): its full barrier.
//
// Lane map, chosen so that every 128-bit load and store phase (8 lanes) touches 8 distinct 16-byte
// bank groups. Lanes 8q .. 8q + 7 (quarter q) take rows r = 4j + 2(q / 2) and r + 1; lane 8q + 4t + p
// converts pair p of row r + t, half h = t ^ (q % 2) of it (pair bytes 64h .. 64h + 63, the values of
// output box 2p + h). Its chunks go in the order (i + p) % 4, so one load phase reads, per row, 4
// distinct chunks of one half and of the other: 8 distinct 16-byte columns of a 128-byte line. A
// chunk's 16 values are the output row's 16-byte chunks 2m and 2m + 1 (m = the chunk's index in its
// half) under the 128-byte swizzle (chunk ^ (row % 8)): in one store phase the lanes of row r
// (r even) write 2m + s ^ (r % 8) and those of row r + 1 write 2m + s ^ (r % 8) ^ 1, so the two
// rows' 4 lanes each fall on the two parities: 8 distinct chunk positions.
template <typename Element, int kWarps, typename BoxAddress, typename FullBarrier>
__device__ __forceinline__ void dequantize_tile(BoxAddress box, FullBarrier full, const float (*scales)[kFp8Tiles],
                                                int warp, int tile_count) {
  const int lane = threadIdx.x % 32;
  const int quarter = lane / 8;
  const int pair = lane % 4;
  const int row_in_pair = (lane / 4) % 2;                 // t: row r + t
  const int half = row_in_pair ^ (quarter % 2);           // h: output box 2 pair + h
  const int row_in_step = 2 * (quarter / 2) + row_in_pair;
  const uint8_t* raw = box(kFp8RawFirstBox + pair) + half * (kFp8TileCols / 2);  // (64 rows, 128 bytes), no swizzle
  uint8_t* out_box = box(2 * pair + half);                                       // (64 rows, 64 values), swizzled
  const int first_step = (warp - tile_count % kWarps + kWarps) % kWarps;
#pragma unroll 1
  for (int step = first_step; step < kFp8Steps; step += kWarps) {
    const int row = step * kFp8RowsPerStep + row_in_step;
    uint4 in[kFp8ChunksPerLane];  // in[i]: chunk (i + pair) % 4 of the half
#pragma unroll
    for (int i = 0; i < kFp8ChunksPerLane; ++i) {
      in[i] = *reinterpret_cast<const uint4*>(raw + row * kFp8TileCols + ((i + pair) % kFp8ChunksPerLane) * 16);
    }
    const uint32_t scale_bits = __float_as_uint(scales[row][pair]);
    // Bit 7 of a byte of nan_bits is set iff that byte of some word is 0x7F or 0xFF
    // (common/fp8_convert.cuh e4m3_nan_bytes, accumulated before its mask).
    uint32_t nan_bits = 0;
#pragma unroll
    for (int i = 0; i < kFp8ChunksPerLane; ++i) {
      nan_bits |= ((in[i].x & 0x7F7F7F7Fu) + 0x01010101u) | ((in[i].y & 0x7F7F7F7Fu) + 0x01010101u) |
                  ((in[i].z & 0x7F7F7F7Fu) + 0x01010101u) | ((in[i].w & 0x7F7F7F7Fu) + 0x01010101u);
    }
    uint32_t factor2;
    const bool fast = fp8_fast_factor<Element>(scale_bits, &factor2) && (nan_bits & 0x80808080u) == 0;
    const bool all_fast = __all_sync(0xffffffffu, fast);
    __syncwarp();  // every lane of these rows has read its raw bytes before any lane overwrites them
    uint4* dst = reinterpret_cast<uint4*>(out_box + row * (kKvBoxCols * 2));
    // in[i]'s 16 values are the output row's 16-byte chunks 2m, 2m + 1 (m = (i + pair) % 4), swizzled.
    const auto store = [&](int i, const uint4 (&out)[2]) {
      const int m = (i + pair) % kFp8ChunksPerLane;
      dst[(2 * m) ^ (row & 7)] = out[0];
      dst[(2 * m + 1) ^ (row & 7)] = out[1];
    };
    if (all_fast) {
#pragma unroll
      for (int i = 0; i < kFp8ChunksPerLane; ++i) {
        uint4 out[2];
        e4m3x16_to_scaled<Element>(in[i], factor2, out);
        store(i, out);
      }
    } else {
      const float scale = __uint_as_float(scale_bits);
#pragma unroll
      for (int i = 0; i < kFp8ChunksPerLane; ++i) {
        const uint4 out[2] = {dequantize_e4m3x8<Element>(make_uint2(in[i].x, in[i].y), scale),
                              dequantize_e4m3x8<Element>(make_uint2(in[i].z, in[i].w), scale)};
        store(i, out);
      }
    }
  }
  // This warp's rows of every V box are written: visible to the tensor core (async proxy), then one
  // arrival per box.
  // With bf16 q the RoPE box is used as it landed; it is complete with the same arrival, after the
  // fence: a gathering producer (sm90 Fp8GatherProducer) writes it with cp.async, through the
  // generic proxy, and S reads it through the async proxy. (S reads it last: nothing waits longer.)
  ptx::fence_proxy_async_smem();
  __syncwarp();
  constexpr int kArrivals = std::is_same_v<Element, __nv_bfloat16> ? kKvBoxesV + 1 : kKvBoxesV;
  static_assert(kKvRopeBox == kKvBoxesV, "lane kKvBoxesV arrives on the RoPE box");
  if (lane < kArrivals) ptx::mbarrier_arrive(full(lane));
  if constexpr (std::is_same_v<Element, __half>) {
    // The RoPE box as fp16: each lane rounds a 16-byte chunk of the warp's rows in place (any chunk
    // order: the rounding is per value); a quarter-warp's 8 lanes one row.
    uint4* rope = reinterpret_cast<uint4*>(box(kKvRopeBox));
#pragma unroll 1
    for (int step = first_step; step < kFp8Steps; step += kWarps) {
      uint4* p = rope + (step * kFp8RowsPerStep + quarter) * 8 + lane % 8;
      *p = rope_bf16x8_to<Element>(*p);
    }
    ptx::fence_proxy_async_smem();
    __syncwarp();
    if (lane == 0) ptx::mbarrier_arrive(full(kKvRopeBox));
  }
}

}  // namespace jax_mla
