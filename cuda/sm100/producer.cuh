// SM100 role: the KV producer (one thread of warp 0). Walks the same pieces of work as every other
// role and streams, per piece, its first KV tile, Q of the CTA's 64-row block, then the piece's
// other KV tiles into the shared ring with the common produce_part and DecodeKVProducer
// (cuda/common/kv_producer.cuh), as SM90 does: locate_tile -> acquire -> load_tile -> commit_step. The ring has one consumer arrival per stage,
// the MMA warp's tcgen05.commit after the tile's P V, which completes only once every MMA reading
// the stage (its Q K^T and its P V) is done.
#pragma once

#include <cstdint>
#include <cuda.h>

#include "../common/kv_producer.cuh"
#include "../common/problem.h"
#include "../common/ptx.cuh"
#include "../common/work_iterator.h"
#include "config.h"

namespace jax_mla::sm100 {

template <typename Element, typename W>
__device__ __forceinline__ void producer_main(SharedStorage<Element>& s, const DecodeProblem& p, const CUtensorMap* q_map,
                                              const CUtensorMap* kv_map, const PartWork& work, int m_block,
                                              const W& wd) {
  DecodeKVProducer<Element, kNumKvStages> producer{&s.kv_bars, &s.kv[0][0][0], {}};
  // Per-stage flag, written before the tile's arrivals (release): whoever acquires the stage's full
  // barriers for this tile sees it. The softmax warpgroup folds it into the piece's result.
  produce_part(
      producer, p, q_map, kv_map, work, m_block, &s.q[0][0], &s.q_full, &s.q_empty,
      [](int) {}, [&](int, int stage, bool ok) { s.tile_bad[stage] = ok ? 0 : 1; }, wd);
}

}  // namespace jax_mla::sm100
