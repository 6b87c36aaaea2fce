// SM90 roles for the FP8 cache (KvFormat::kFp8; the tile format and its rewrite are shared with SM100
// in common/fp8_tile.cuh):
//   Fp8RingProducer      warpgroup 0, thread 0: a tile's FP8 bytes by TMA into its slots of the ring
//   dequantize_part      warpgroup 0, warps 1-3: those bytes rewritten in place as 16-bit boxes
// The consumers (mainloop.cuh) are those of the 16-bit cache: they wait on each box's full barrier,
// which here completes with the dequantizing warps' arrivals instead of TMA bytes.
#pragma once

#include <cstdint>
#include <cuda.h>

#include "../common/fp8_tile.cuh"
#include "../common/kv_producer.cuh"
#include "../common/work_iterator.h"
#include "config.h"

namespace jax_mla::sm90 {

// Producer of the FP8 ring: the box ring's tile walk (locate, acquire, advance), with load_tile
// replaced: a tile's 9 slots are consecutive (TileSlots), so the tile is load_fp8_tile's boxes.
template <typename Element>
struct Fp8RingProducer : BoxRingProducer<Element, kNumSlots> {
  Fp8Staging* staging;
  const CUtensorMap* scale_map;
  const CUtensorMap* rope_map;

  // withheld_box >= 0 (the self-check's fault injection): the whole tile is left out.
  __device__ __forceinline__ void load_tile(const PagedKV& kv, const TileSource& t, int withheld_box = -1) {
    if (withheld_box >= 0) return;
    const int position = this->tile.first / kKvBoxesQK;
    load_fp8_tile(reinterpret_cast<uint8_t*>(this->smem + static_cast<size_t>(this->tile.slot(0)) * kKvBoxElems),
                  staging->scales[position], &staging->raw_full[position], kv, t, scale_map, rope_map);
  }
};

// warp: 0..kDequantWarps-1 (warps 1-3 of warpgroup 0). Walks the same tiles in the same order as the
// producer and the consumers (work_iterator.h), so all agree on every slot and parity; the wait on a
// position's raw_full completes for its next tile only after both consumers released it.
template <typename Element, typename W>
__device__ __forceinline__ void dequantize_part(SharedStorage<Element>& s, const PartWork& work, int warp,
                                                const W& wd) {
  TileSlots<kNumSlots> tile;
  int tile_count = 0;
  work.for_each_piece([&](const PieceOfWork& w, int) {
#pragma unroll 1
    for (int blk = w.begin_block; blk < w.end_block; ++blk) {
      const int position = tile.first / kKvBoxesQK;
      wd.wait(&s.fp8.raw_full[position], tile.phase);
      dequantize_tile<Element, kDequantWarps>(reinterpret_cast<uint8_t*>(&s.kv[tile.slot(0)][0]),
                                              s.fp8.scales[position], &s.kv_bars.full[tile.slot(0)], warp,
                                              tile_count);
      tile.advance();
      ++tile_count;
    }
  });
}

}  // namespace jax_mla::sm90
