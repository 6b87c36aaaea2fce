// SM90 role: the KV producer (one thread of warpgroup 0). Walks the CTA's part with the common
// produce_part (cuda/common/kv_producer.cuh): per piece, its first KV tile, Q of the CTA's 64-row
// block, then the piece's other tiles into the box ring, as grouped copies for pages of >= 64
// tokens (kv_group_map set), else box by box. Each tile position of the ring goes back once both consumers released it.
#pragma once

#include <cstdint>
#include <cuda.h>

#include "../common/kv_producer.cuh"
#include "../common/problem.h"
#include "../common/work_iterator.h"
#include "config.h"

namespace jax_mla::sm90 {

// kv_group_map: the cache's column-box view, or nullptr for box-by-box loads.
template <typename Element, typename W>
__device__ __forceinline__ void producer_main(SharedStorage<Element>& s, const DecodeProblem& p,
                                              const CUtensorMap* q_map, const CUtensorMap* kv_map,
                                              const CUtensorMap* kv_group_map, const PartWork& work, int m_block,
                                              const W& wd) {
  BoxRingProducer<Element, kNumSlots> producer{&s.kv_bars, &s.kv[0][0], {}};
  producer.group_map = kv_group_map;
  // A bad block-table entry anywhere in a piece makes the whole request NaN: the flag is per piece
  // (kBadFlagSlots slots by ordinal), cleared before the piece's first tile and set before the bad
  // tile's arrivals.
  produce_part(
      producer, p, q_map, kv_map, work, m_block, &s.q[0][0], &s.q_full, &s.q_empty,
      [&](int ordinal) { s.bad_request[ordinal & (kBadFlagSlots - 1)] = 0; },
      [&](int ordinal, int, bool ok) {
        if (!ok) s.bad_request[ordinal & (kBadFlagSlots - 1)] = 1;
      },
      wd);
}

}  // namespace jax_mla::sm90
