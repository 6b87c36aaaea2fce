// SM90 roles for the FP8 cache (KvFormat::kFp8; layout in common/config.h, ring plan in config.h):
//   Fp8RingProducer      warpgroup 0, thread 0: a tile's FP8 bytes by TMA into the box ring
//   dequantize_part      warpgroup 0, warps 1-3: those bytes rewritten in place as 16-bit boxes
// The consumers (mainloop.cuh) are those of the 16-bit cache: they wait on each box's full barrier,
// which here completes with the dequantizing warps' arrivals instead of TMA bytes.
//
// Values are exactly unpack_fp8_kv(row, q's dtype), as the portable kernel's (common/fp8_convert.cuh):
// where a row's tile scale is +-0 or +-2^k with k in the exact range of the element type and no byte
// is NaN, by placing each e4m3 byte in the 16-bit float's fields and one 16-bit multiply; otherwise
// (a warp vote per step) through fp32 as the portable kernel does.
#pragma once

#include <cstdint>
#include <cuda.h>
#include <cuda_fp16.h>
#include <type_traits>

#include "../common/fp8_tile.cuh"
#include "../common/kv_producer.cuh"
#include "../common/ptx.cuh"
#include "../common/work_iterator.h"
#include "config.h"

namespace jax_mla::sm90 {

// Producer of the FP8 ring: the box ring's tile walk (locate, acquire, advance), with load_tile
// replaced. Every copy of a tile completes the position's raw_full barrier. Per page chunk of the
// tile (one for pages of >= 64 tokens): the four pairs' e4m3 bytes, (rows, 128) bytes each, into
// the slots of boxes kFp8RawFirstBox.. (kv.map: the cache as (tokens, 656) bytes, box (rows, 128));
// the rows' scales, (rows, 16) bytes (scale_map); the RoPE values as bf16 with the 128-byte swizzle
// into box 8's slot (rope_map: the cache as (tokens, 328) bf16, box (rows, 64)). Tokens past the
// cache's end are zero-filled by TMA and count their bytes, so the barrier always gets a whole tile.
template <typename Element>
struct Fp8RingProducer : BoxRingProducer<Element, kNumSlots> {
  Fp8Staging* staging;
  const CUtensorMap* scale_map;
  const CUtensorMap* rope_map;

  // withheld_box >= 0 (the self-check's fault injection): the whole tile is left out.
  __device__ __forceinline__ void load_tile(const PagedKV& kv, const TileSource& t, int withheld_box = -1) {
    if (withheld_box >= 0) return;
    const int position = this->tile.first / kKvBoxesQK;
    uint64_t* bar = &staging->raw_full[position];
    ptx::mbarrier_arrive_expect_tx(bar, kFp8TileBytes);
    uint8_t* ring = reinterpret_cast<uint8_t*>(this->smem);
    // Unrolled over the most chunks a tile has, so that t.rows stays in registers.
#pragma unroll
    for (int c = 0; c < kBlockN / kMinGpuPageSize; ++c) {
      if (c >= t.copies) break;
      const int first_row = c * t.box_rows;  // of the tile
#pragma unroll
      for (int pair = 0; pair < kFp8Tiles; ++pair) {
        uint8_t* dst = ring + static_cast<size_t>(this->tile.slot(kFp8RawFirstBox + pair)) * kKvBoxBytes +
                       first_row * kFp8TileCols;
        ptx::tma_load_2d(dst, kv.map, bar, pair * kFp8TileCols, t.rows[c]);
      }
      ptx::tma_load_2d(&staging->scales[position][first_row][0], scale_map, bar, kFp8ScalesOffset, t.rows[c]);
      ptx::tma_load_2d(this->smem + static_cast<size_t>(this->tile.slot(kKvRopeBox)) * kKvBoxElems +
                           first_row * kKvBoxCols,
                       rope_map, bar, kFp8RopeOffset / 2, t.rows[c]);
    }
  }
};

// One warp's share of a tile is common/fp8_tile.cuh's dequantize_tile, written out here on the
// ring's slots: SM90 keeps the copy whose machine code ran the GPU tests and the benchmark (H100,
// 2026-12-07); the next change to it should call the shared dequantize_tile and load_fp8_tile (their
// SASS differs by register allocation only) and run the tests again.

// warp: 0..kDequantWarps-1 (warps 1-3 of warpgroup 0). Walks the same tiles in the same order as the
// producer and the consumers (work_iterator.h), so all agree on every slot and parity.
template <typename Element, typename W>
__device__ __forceinline__ void dequantize_part(SharedStorage<Element>& s, const PartWork& work, int warp,
                                                const W& wd) {
  const int lane = threadIdx.x % 32;
  const int chunk = lane % 8;              // bytes 16 chunk .. +15 of the row's pair: columns of the pair
  const int row_in_group = lane / 8;
  const int out_box = chunk / 4;           // 0: box 2k, 1: box 2k + 1
  const int out_chunk = 2 * (chunk % 4);   // the first of the two 16-byte chunks (8 values each) it writes
  // A row's 8 lanes store in one phase of a 128-bit store: lanes 0-3 to box 2k and lanes 4-7 to box
  // 2k + 1 (8 KB apart, the same banks) would hit the same chunk positions. So lanes 4-7 convert
  // their two halves in the other order and store the odd chunk first: each store covers all 8
  // chunk positions of the row once.
  const bool swap_halves = out_box == 1;
  uint8_t* ring = reinterpret_cast<uint8_t*>(&s.kv[0][0]);
  TileSlots<kNumSlots> tile;
  int tile_count = 0;
  work.for_each_piece([&](const PieceOfWork& w, int) {
#pragma unroll 1
    for (int blk = w.begin_block; blk < w.end_block; ++blk) {
      const int position = tile.first / kKvBoxesQK;
      wd.wait(&s.fp8.raw_full[position], tile.phase);
      if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
        // The RoPE box landed as it is used.
        if (lane == 0) ptx::mbarrier_arrive(&s.kv_bars.full[tile.slot(kKvRopeBox)]);
      }
      const int first_group = (warp - tile_count % kDequantWarps + kDequantWarps) % kDequantWarps;
      // (pair, row) of one step: pair-major, the warp's groups in order within a pair.
      const auto load = [&](int pair, int row) {
        RawChunk r;
        r.bytes = *reinterpret_cast<const uint4*>(
            ring + static_cast<size_t>(tile.slot(kFp8RawFirstBox + pair)) * kKvBoxBytes + row * kFp8TileCols +
            chunk * 16);
        r.scale_bits = __float_as_uint(s.fp8.scales[position][row][pair]);
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
        int next_row = row + kDequantWarps * kFp8RowsPerGroup;
        if (next_row >= kBlockN) {
          next_row = first_group * kFp8RowsPerGroup + row_in_group;
          ++next_pair;
        }
        // The next step reads other rows, or the next pair's raw slot, which no output of this pair
        // overwrites: its loads may go before this step's stores.
        if (next_pair < kFp8Tiles) next = load(next_pair, next_row);
        __syncwarp();  // every lane of these rows has read its raw bytes before any lane overwrites them
        uint4* dst = reinterpret_cast<uint4*>(ring + static_cast<size_t>(tile.slot(2 * pair + out_box)) * kKvBoxBytes +
                                              row * (kKvBoxCols * 2));
        // The 128-byte swizzle: 16-byte chunk index ^ (row % 8). out[0] holds this lane's first
        // (swap_halves: second) 8 values.
        dst[(out_chunk + swap_halves) ^ (row & 7)] = out[0];
        dst[(out_chunk + !swap_halves) ^ (row & 7)] = out[1];
        if (next_pair != pair) {
          // This warp's rows of the pair are written: make them visible to the consumers' wgmma
          // (async proxy), then one arrival per box for the warp.
          ptx::fence_proxy_async_smem();
          __syncwarp();
          if (lane == 0) {
            ptx::mbarrier_arrive(&s.kv_bars.full[tile.slot(2 * pair)]);
            ptx::mbarrier_arrive(&s.kv_bars.full[tile.slot(2 * pair + 1)]);
          }
          if (next_pair == kFp8Tiles) break;
        }
        pair = next_pair;
        row = next_row;
      }
      if constexpr (std::is_same_v<Element, __half>) {
        // The RoPE box as fp16: each lane rounds a 16-byte chunk of its rows in place (any chunk
        // order: the rounding is per value).
        uint4* rope = reinterpret_cast<uint4*>(ring + static_cast<size_t>(tile.slot(kKvRopeBox)) * kKvBoxBytes);
#pragma unroll 1
        for (int g = first_group; g < kFp8Groups; g += kDequantWarps) {
          const int row = g * kFp8RowsPerGroup + row_in_group;
          uint4* p = rope + row * 8 + chunk;
          *p = rope_bf16x8_to<Element>(*p);
        }
        ptx::fence_proxy_async_smem();
        __syncwarp();
        if (lane == 0) ptx::mbarrier_arrive(&s.kv_bars.full[tile.slot(kKvRopeBox)]);
      }
      tile.advance();
      ++tile_count;
    }
  });
}

}  // namespace jax_mla::sm90
