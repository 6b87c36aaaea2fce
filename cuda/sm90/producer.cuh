// SM90 role: the KV producer (one thread of warpgroup 0; its whole warp for an FP8 cache of one-token
// pages, the sparse decode's view, which it gathers: fp8_tiles.cuh Fp8GatherProducer). Walks the
// CTA's part with the common produce_part (cuda/common/kv_producer.cuh): per piece, its first KV
// tile, Q of the CTA's 64-row block, then the piece's other tiles into the box ring, as grouped
// copies for pages of >= 64 tokens (kv_group_map set), else box by box; an FP8 cache's tiles as
// their raw bytes (fp8_tiles.cuh). Each tile position of the ring goes back once both consumers released it.
#pragma once

#include <cstdint>
#include <cuda.h>

#include "../common/kv_producer.cuh"
#include "../common/problem.h"
#include "../common/work_iterator.h"
#include "config.h"
#include "fp8_tiles.cuh"

namespace jax_mla::sm90 {

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
    BoxRingProducer<Element, kNumSlots> producer{&s.kv_bars, &s.kv[0][0], {}};
    producer.group_map = kv_group_map;
    produce_part(producer, p, q_map, kv_map, work, m_block, &s.q[0][0], &s.q_full, &s.q_empty, on_piece, on_tile, wd);
  }
}

}  // namespace jax_mla::sm90
