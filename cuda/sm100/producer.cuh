// SM100 role: the KV producer (one thread of warp 0; the whole warp for an FP8 cache of one-token
// pages, the sparse decode's view, which it gathers: fp8_tiles.cuh Fp8StageGatherProducer). Walks the same pieces of work as every other
// role and streams, per piece, its first KV tile, Q of the CTA's 64-row block, then the piece's
// other KV tiles into the shared ring with the common produce_part and DecodeKVProducer
// (cuda/common/kv_producer.cuh), as SM90 does: locate_tile -> acquire -> load_tile -> commit_step. The ring has one consumer arrival per stage,
// the MMA warp's tcgen05.commit after the tile's P V, which completes only once every MMA reading
// the stage (its Q K^T and its P V) is done. An FP8 cache's tiles land as their raw bytes
// (fp8_tiles.cuh Fp8StageProducer), which warps 2-3 turn into the stage's 16-bit boxes.
#pragma once

#include <cstdint>
#include <cuda.h>

#include "../common/kv_producer.cuh"
#include "../common/problem.h"
#include "../common/ptx.cuh"
#include "../common/work_iterator.h"
#include "config.h"
#include "fp8_tiles.cuh"

namespace jax_mla::sm100 {

// 16-bit cache: kv_map is the cache's (tokens, 576) view in boxes; kv_rope_map and kv_scale_map are
// unused. FP8 cache (fp8_tiles.cuh): kv_map the (tokens, 656) bytes in boxes of (rows, 128),
// kv_rope_map the RoPE values' bf16 view, kv_scale_map the scales' byte view.
template <typename Element, KvFormat kFormat, typename W>
__device__ __forceinline__ void producer_main(SharedStorage<Element>& s, const DecodeProblem& p, const CUtensorMap* q_map,
                                              const CUtensorMap* kv_map, const CUtensorMap* kv_rope_map,
                                              const CUtensorMap* kv_scale_map, const PartWork& work, int m_block,
                                              const W& wd) {
  // Per-stage flag, written before the tile's arrivals (release): whoever acquires the stage's full
  // barriers for this tile sees it (FP8: through the dequantizing warps, which acquire raw_full
  // before their arrivals). The softmax warpgroup folds it into the piece's result.
  const auto on_tile = [&](int, int stage, bool ok) { s.tile_bad[stage] = ok ? 0 : 1; };
  if constexpr (kFormat == KvFormat::kFp8) {
    if (p.page_size == 1) {  // the whole warp (decode_kernel.cuh): one-token pages, gathered
      Fp8StageGatherProducer<Element> producer{{&s.kv_bars, &s.kv[0][0][0], {}}, &s.fp8,
                                               static_cast<const uint8_t*>(p.kv_cache)};
      produce_part(producer, p, q_map, kv_map, work, m_block, &s.q[0][0], &s.q_full, &s.q_empty, [](int) {}, on_tile,
                   wd);
      return;
    }
    Fp8StageProducer<Element> producer{{&s.kv_bars, &s.kv[0][0][0], {}}, &s.fp8, kv_scale_map, kv_rope_map};
    produce_part(producer, p, q_map, kv_map, work, m_block, &s.q[0][0], &s.q_full, &s.q_empty, [](int) {}, on_tile,
                 wd);
  } else {
    (void)kv_rope_map;
    (void)kv_scale_map;
    DecodeKVProducer<Element, kNumKvStages> producer{&s.kv_bars, &s.kv[0][0][0], {}};
    produce_part(producer, p, q_map, kv_map, work, m_block, &s.q[0][0], &s.q_full, &s.q_empty, [](int) {}, on_tile,
                 wd);
  }
}

}  // namespace jax_mla::sm100
