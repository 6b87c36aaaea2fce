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
  int (*gather_slots)[kRingTiles][kBlockN];
  uint64_t (*slots_ready)[kRingTiles];

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
    // EXPERIMENT: publish the tile's 64 slots for warps 1-3 (the position is free: acquire() passed),
    // then gather tokens 0-15 here.
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int i = 0; i < kBlockN / 32; ++i) (*gather_slots)[position][lane + 32 * i] = t.slot[i];
    __syncwarp();
    if (lane == 0) ptx::mbarrier_arrive(&(*slots_ready)[position]);
    gather_fp8_tokens([&](int b) { return ring + static_cast<size_t>(tile.slot(b)) * kKvBoxBytes; }, staging,
                      position, cache, t.slot[0], 0, kBlockN / kGatherWarps);
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

// EXPERIMENT: warps 1-3 of warpgroup 0 with gathered one-token pages: per tile, first the rewrite of
// the previous tile (as dequantize_part), then this warp's 16 tokens of the tile (slots from warp 0,
// once it found the position free and published them on slots_ready). The rewrite of tile t - 1
// needs all four warps' copies of t - 1, issued an iteration earlier; the gather of t waits only for
// the consumers' release of t - 2, which needs the rewrite of t - 2, done an iteration earlier: no
// cycle.
template <typename Element, typename W>
__device__ __forceinline__ void gather_dequantize_part(SharedStorage<Element>& s, const DecodeProblem& p,
                                                       const PartWork& work, int warp, const W& wd) {
  uint8_t* ring = reinterpret_cast<uint8_t*>(&s.kv[0][0]);
  const uint8_t* cache = static_cast<const uint8_t*>(p.kv_cache);
  const int first = kBlockN / kGatherWarps * (warp + 1);
  const int lane = threadIdx.x % 32;
  TileSlots<kNumSlots> tile, prev;
  int tile_count = 0;
  const auto rewrite = [&](const TileSlots<kNumSlots>& t, int count) {
    const int position = t.first / kKvBoxesQK;
    wd.wait(&s.fp8.raw_full[position], t.phase);
    dequantize_tile<Element, kDequantWarps>(
        [&](int b) { return ring + static_cast<size_t>(t.slot(b)) * kKvBoxBytes; },
        [&](int b) { return &s.kv_bars.full[t.slot(b)]; }, s.fp8.scales[position], warp, count);
  };
  work.for_each_piece([&](const PieceOfWork& w, int) {
#pragma unroll 1
    for (int blk = w.begin_block; blk < w.end_block; ++blk) {
      if (tile_count > 0) rewrite(prev, tile_count - 1);
      const int position = tile.first / kKvBoxesQK;
      wd.wait(&s.slots_ready[position], tile.phase);
      if (wd.live()) {
        const int my_slot = lane < kBlockN / kGatherWarps ? s.gather_slots[position][first + lane] : -1;
        gather_fp8_tokens([&](int b) { return ring + static_cast<size_t>(tile.slot(b)) * kKvBoxBytes; }, &s.fp8,
                          position, cache, my_slot, first, kBlockN / kGatherWarps);
      }
      prev = tile;
      tile.advance();
      ++tile_count;
    }
  });
  if (tile_count > 0) rewrite(prev, tile_count - 1);
}

}  // namespace jax_mla::sm90
