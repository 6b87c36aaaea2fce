// SM100 roles for the FP8 cache (KvFormat::kFp8; the tile format and its rewrite are shared with SM90
// in common/fp8_tile.cuh):
//   Fp8StageProducer     warp 0, one thread: a tile's FP8 bytes by TMA into a KV stage
//   Fp8StageGatherProducer  warp 0, all lanes: the same for one-token pages (the sparse decode), by cp.async
//   dequantize_part      warps 2-3: those bytes rewritten in place as the stage's 16-bit boxes
// The other roles are those of the 16-bit cache: the MMA warp and the softmax warpgroup wait on each
// box's full barrier, which here completes with the dequantizing warps' arrivals instead of TMA
// bytes. The tensor core reads the boxes through the async proxy (tcgen05.mma operands): every lane
// fences its generic stores (fence.proxy.async) before its warp's arrival, as the softmax does for P.
#pragma once

#include <cstdint>
#include <cuda.h>

#include "../common/fp8_tile.cuh"
#include "../common/kv_producer.cuh"
#include "../common/work_iterator.h"
#include "config.h"

namespace jax_mla::sm100 {

// Producer of the FP8 stage ring: DecodeKVProducer's tile walk (locate, acquire, commit_step), with
// load_tile replaced by load_fp8_tile into the stage.
template <typename Element>
struct Fp8StageProducer : DecodeKVProducer<Element, kNumKvStages> {
  Fp8Staging* staging;
  const CUtensorMap* scale_map;
  const CUtensorMap* rope_map;

  // withheld_box >= 0 (the self-check's fault injection): the whole tile is left out, so its
  // dequantizing warps, and through them every consumer, wait for it.
  __device__ __forceinline__ void load_tile(const PagedKV& kv, const TileSource& t, int withheld_box = -1) {
    if (withheld_box >= 0) return;
    const int stage = this->state.stage;
    uint8_t* boxes = reinterpret_cast<uint8_t*>(this->stage_ptr(stage));
    load_fp8_tile([&](int b) { return boxes + b * kKvBoxBytes; }, staging->scales[stage], &staging->raw_full[stage],
                  kv, t, scale_map, rope_map);
  }
};

// Producer of the FP8 stage ring for pages of one token (the sparse decode's view,
// runtime/sparse_launch.h): DecodeKVProducer's tile walk with the whole producer warp gathering each
// tile into the stage (common/fp8_tile.cuh gather_fp8_tile: cp.async, one raw_full arrival per lane),
// as the SM90 kernel's Fp8GatherProducer does on its box ring.
template <typename Element>
struct Fp8StageGatherProducer : DecodeKVProducer<Element, kNumKvStages> {
  static constexpr bool kWarpWide = true;
  Fp8Staging* staging;
  const uint8_t* cache;  // (slots, 656) bytes

  __device__ __forceinline__ GatheredTile locate_tile(const PagedKV& kv, int first_token) const {
    return locate_gathered_tile(kv, first_token);
  }
  // withheld_box >= 0 (the self-check's fault injection): the whole tile is left out.
  __device__ __forceinline__ void load_tile(const PagedKV&, const GatheredTile& t, int withheld_box = -1) {
    if (withheld_box >= 0) return;
    const int stage = this->state.stage;
    uint8_t* boxes = reinterpret_cast<uint8_t*>(this->stage_ptr(stage));
    gather_fp8_tile([&](int b) { return boxes + b * kKvBoxBytes; }, staging, stage, cache, t);
  }
};

// warp: 0..kDequantWarps-1 (warps 2-3). Walks the same tiles in the same order as the producer, the
// MMA warp and the softmax (work_iterator.h), so all agree on every stage and parity. A stage's
// raw_full completes for its next tile only after the stage was released (after that tile's P V),
// which is after every wait of the other roles on the previous tile's full barriers: each wait here
// and each arrival on a full barrier belongs to one phase.
template <typename Element, typename W>
__device__ __forceinline__ void dequantize_part(SharedStorage<Element>& s, const PartWork& work, int warp,
                                                const W& wd) {
  PipelineState<kNumKvStages> st;
  int tile_count = 0;
  work.for_each_piece([&](const PieceOfWork& w, int) {
#pragma unroll 1
    for (int blk = w.begin_block; blk < w.end_block; ++blk) {
      wd.wait(&s.fp8.raw_full[st.stage], st.phase);
      uint8_t* boxes = reinterpret_cast<uint8_t*>(&s.kv[st.stage][0][0]);
      uint64_t* full = s.kv_bars.full[st.stage];
      dequantize_tile<Element, kDequantWarps>([&](int b) { return boxes + b * kKvBoxBytes; },
                                              [&](int b) { return &full[b]; }, s.fp8.scales[st.stage], warp,
                                              tile_count);
      st.advance();
      ++tile_count;
    }
  });
}

}  // namespace jax_mla::sm100
