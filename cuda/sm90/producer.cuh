// SM90 role: the KV producer (one thread of warpgroup 0; its whole warp for an FP8 cache of one-token
// pages, the sparse decode's view, which it gathers: fp8_tiles.cuh Fp8GatherProducer). Walks the CTA's part with the common
// produce_part (cuda/common/kv_producer.cuh): per piece, its first KV tile, Q of the CTA's 64-row
// block, then the piece's other tiles into the box ring, as grouped copies for pages of >= 64
// tokens (kv_group_map set), else box by box; an FP8 cache's tiles as their raw bytes
// (fp8_tiles.cuh). Each tile position of the ring goes back once both consumers released it.
#pragma once

#include <cstdint>
#include <cuda.h>

#include "../common/kv_producer.cuh"
#include "../common/problem.h"
#include "../common/work_iterator.h"
#include "config.h"
#include "fp8_tiles.cuh"

namespace jax_mla::sm90 {

// Producer of the 16-bit box ring for pages of one token (the sparse decode's view): the whole warp
// gathers each box of the tile with cp.async, 16 bytes a lane (chunk lane % 8 of tokens 4 i + lane / 8),
// swizzled as the tensor copies would land it, and arrives on the box's full barrier once its copies
// landed (kGatherLanes noinc arrivals a box). Tokens past seq_len and slots outside the cache are
// zero-filled. The consumers fence for the async proxy after each box wait (BoxRingConsumer::gathered):
// cp.async writes through the generic proxy.
template <typename Element>
struct BoxGatherProducer {
  static constexpr int kRingTiles = kNumSlots / kKvBoxesQK;
  static constexpr bool kWarpWide = true;
  BoxRingBarriers<kNumSlots>* bars;
  uint8_t* ring;         // (slot, BLK_N, 64) 16-bit values
  const uint8_t* cache;  // (slots, 576) 16-bit values
  TileSlots<kNumSlots> tile;

  using Source = GatheredTile;
  __device__ __forceinline__ Source locate_tile(const PagedKV& kv, int first_token) const {
    return locate_gathered_tile(kv, first_token);
  }
  template <typename W = NoWatchdog>
  __device__ __forceinline__ void acquire(const W& wd = W{}) const {
    wd.wait(&bars->empty[tile.slot(0)], tile.phase_of(0) ^ 1u);
  }
  __device__ __forceinline__ void load_tile(const PagedKV&, const Source& t, int withheld_box = -1) {
    const int lane = threadIdx.x % 32;
    const int chunk = lane % 8;
    constexpr int kRowBytes = kHeadDimQK * 2;
#pragma unroll 1
    for (int box = 0; box < kKvBoxesQK; ++box) {
      if (box == withheld_box) continue;
      uint8_t* dst = ring + static_cast<size_t>(tile.slot(box)) * kKvBoxBytes;
#pragma unroll 4
      for (int i = 0; i < kBlockN / 4; ++i) {
        const int j = 4 * i + lane / 8;  // the token (row of the box)
        const int slot = __shfl_sync(0xffffffffu, t.slot[i / 8], j % 32);
        const uint8_t* src = cache + static_cast<int64_t>(slot >= 0 ? slot : 0) * kRowBytes + box * 128 + chunk * 16;
        ptx::cp_async_16(dst + j * 128 + ((chunk ^ (j & 7)) * 16), src, slot >= 0 ? 16u : 0u);
      }
      ptx::cp_async_mbarrier_arrive_noinc(&bars->full[tile.slot(box)]);
    }
  }
  __device__ __forceinline__ void commit_step() { tile.advance(); }
  __device__ __forceinline__ int tile_stage() const { return tile.first; }
};
static_assert(kBlockN == 64, "token 4 i + lane / 8 is below 32 (slot[0]) exactly when i < 8");

// One-token pages (the sparse decode's view), gathered by the whole warp. Not inlined: its registers
// then do not weigh on the tensor-copy producer's (warpgroup 0 runs at kProducerRegs).
template <typename Producer, typename Element, typename OnPiece, typename OnTile, typename W>
__device__ __noinline__ void gather_part(Producer producer, const DecodeProblem& p, const CUtensorMap* q_map,
                                         const CUtensorMap* kv_map, const PartWork& work, int m_block,
                                         SharedStorage<Element>& s, OnPiece on_piece, OnTile on_tile, const W& wd) {
  produce_part(producer, p, q_map, kv_map, work, m_block, &s.q[0][0], &s.q_full, &s.q_empty, on_piece, on_tile, wd);
}

// 16-bit cache: kv_map is the cache's (tokens, 576) view in boxes; kv_group_map its column-box
// view for grouped copies, or nullptr for box-by-box loads. FP8 cache (fp8_tiles.cuh): kv_map the
// (tokens, 656) bytes in boxes of (rows, 128), kv_group_map the RoPE values' bf16 view, kv_scale_map
// the scales' byte view.
template <typename Element, KvFormat kFormat, typename W>
__device__ __forceinline__ void producer_main(SharedStorage<Element>& s, const DecodeProblem& p,
                                              const CUtensorMap* q_map, const CUtensorMap* kv_map,
                                              const CUtensorMap* kv_group_map, const CUtensorMap* kv_scale_map,
                                              const PartWork& work, int m_block, const W& wd) {
  // A bad block-table entry anywhere in a piece makes the whole request NaN: the flag is per piece
  // (kBadFlagSlots slots by ordinal), cleared before the piece's first tile and set before the bad
  // tile's arrivals.
  const auto on_piece = [&](int ordinal) { s.bad_request[ordinal & (kBadFlagSlots - 1)] = 0; };
  const auto on_tile = [&](int ordinal, int, bool ok) {
    if (!ok) s.bad_request[ordinal & (kBadFlagSlots - 1)] = 1;
  };
  if constexpr (kFormat == KvFormat::kFp8) {
    if (p.page_size == 1) {  // the whole warp (decode_kernel.cuh): one-token pages, gathered
      gather_part(Fp8GatherProducer<Element>{&s.kv_bars, reinterpret_cast<uint8_t*>(&s.kv[0][0]), &s.fp8,
                                             static_cast<const uint8_t*>(p.kv_cache), {}},
                  p, q_map, kv_map, work, m_block, s, on_piece, on_tile, wd);
      return;
    }
    Fp8RingProducer<Element> producer{{&s.kv_bars, &s.kv[0][0], {}}, &s.fp8, kv_scale_map, kv_group_map};
    produce_part(producer, p, q_map, kv_map, work, m_block, &s.q[0][0], &s.q_full, &s.q_empty, on_piece, on_tile, wd);
  } else {
    if (p.page_size == 1) {  // the whole warp (decode_kernel.cuh): one-token pages, gathered
      gather_part(BoxGatherProducer<Element>{&s.kv_bars, reinterpret_cast<uint8_t*>(&s.kv[0][0]),
                                             static_cast<const uint8_t*>(p.kv_cache), {}},
                  p, q_map, kv_map, work, m_block, s, on_piece, on_tile, wd);
      return;
    }
    BoxRingProducer<Element, kNumSlots> producer{&s.kv_bars, &s.kv[0][0], {}};
    producer.group_map = kv_group_map;
    produce_part(producer, p, q_map, kv_map, work, m_block, &s.q[0][0], &s.q_full, &s.q_empty, on_piece, on_tile, wd);
  }
}

}  // namespace jax_mla::sm90
