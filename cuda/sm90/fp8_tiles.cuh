// SM90 roles for the FP8 cache (KvFormat::kFp8; layout in common/config.h, ring plan in config.h):
//   Fp8RingProducer      warpgroup 0, thread 0: a tile's FP8 bytes by TMA into the box ring
//   dequantize_part      warpgroup 0, warps 1-3: those bytes rewritten in place as 16-bit boxes
// Both are common/fp8_tile.cuh's load_fp8_tile and dequantize_tile (shared with SM100) on this ring.
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
// replaced by load_fp8_tile into the tile's own slots (raw_full of the tile's ring position).
template <typename Element>
struct Fp8RingProducer : BoxRingProducer<Element, kNumSlots> {
  Fp8Staging* staging;
  const CUtensorMap* scale_map;
  const CUtensorMap* rope_map;

  // withheld_box >= 0 (the self-check's fault injection): the whole tile is left out.
  __device__ __forceinline__ void load_tile(const PagedKV& kv, const TileSource& t, int withheld_box = -1) {
    if (withheld_box >= 0) return;
    const int position = this->tile.first / kKvBoxesQK;
    uint8_t* ring = reinterpret_cast<uint8_t*>(this->smem);
    const TileSlots<kNumSlots> tile = this->tile;
    load_fp8_tile([&](int b) { return ring + static_cast<size_t>(tile.slot(b)) * kKvBoxBytes; },
                  staging->scales[position], &staging->raw_full[position], kv, t, scale_map, rope_map);
  }
};

// Producer of the FP8 ring for pages of one token (the sparse decode's view): the box ring's tile
// walk with the whole producer warp gathering each tile (common/fp8_tile.cuh gather_fp8_tile) into
// the tile's own slots.
template <typename Element>
struct Fp8GatherProducer {
  static constexpr int kRingTiles = kNumSlots / kKvBoxesQK;
  static constexpr bool kWarpWide = true;
  BoxRingBarriers<kNumSlots>* bars;
  uint8_t* ring;          // (slot, BLK_N, 128 bytes)
  Fp8Staging* staging;
  const uint8_t* cache;   // (slots, 656) bytes
  TileSlots<kNumSlots> tile;

  using Source = GatheredTile;
  __device__ __forceinline__ Source locate_tile(const PagedKV& kv, int first_token) const {
    return locate_gathered_tile(kv, first_token);
  }
  template <typename W = NoWatchdog>
  __device__ __forceinline__ void acquire(const W& wd = W{}) const {
    wd.wait(&bars->empty[tile.slot(0)], tile.phase_of(0) ^ 1u);
  }
  // withheld_box >= 0 (the self-check's fault injection): the whole tile is left out.
  __device__ __forceinline__ void load_tile(const PagedKV&, const Source& t, int withheld_box = -1) {
    if (withheld_box >= 0) return;
    const int position = tile.first / kKvBoxesQK;
    gather_fp8_tile([&](int b) { return ring + static_cast<size_t>(tile.slot(b)) * kKvBoxBytes; }, staging, position,
                    cache, t);
  }
  __device__ __forceinline__ void commit_step() { tile.advance(); }
  __device__ __forceinline__ int tile_stage() const { return tile.first; }
};

// warp: 0..kDequantWarps-1 (warps 1-3 of warpgroup 0). Walks the same tiles in the same order as the
// producer and the consumers (work_iterator.h), so all agree on every slot and parity.
template <typename Element, typename W>
__device__ __forceinline__ void dequantize_part(SharedStorage<Element>& s, const PartWork& work, int warp,
                                                const W& wd) {
  uint8_t* ring = reinterpret_cast<uint8_t*>(&s.kv[0][0]);
  TileSlots<kNumSlots> tile;
  int tile_count = 0;
  work.for_each_piece([&](const PieceOfWork& w, int) {
#pragma unroll 1
    for (int blk = w.begin_block; blk < w.end_block; ++blk) {
      const int position = tile.first / kKvBoxesQK;
      wd.wait(&s.fp8.raw_full[position], tile.phase);
      dequantize_tile<Element, kDequantWarps>(
          [&](int b) { return ring + static_cast<size_t>(tile.slot(b)) * kKvBoxBytes; },
          [&](int b) { return &s.kv_bars.full[tile.slot(b)]; }, s.fp8.scales[position], warp, tile_count);
      tile.advance();
      ++tile_count;
    }
  });
}

}  // namespace jax_mla::sm90
