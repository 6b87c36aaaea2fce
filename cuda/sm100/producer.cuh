// SM100 role: the KV producer (one thread of warp 0). Walks the same pieces of work as every other
// role and streams, per piece, Q of the CTA's 64-row block and then the piece's KV tiles into the
// shared ring with the common DecodeKVProducer (cuda/common/kv_producer.cuh), unchanged from SM90:
// locate_tile -> acquire -> load_tile -> commit_step. The ring has one consumer arrival per stage,
// the MMA warp's tcgen05.commit after the tile's P V, which completes only once every MMA reading
// the stage (its Q K^T and its P V) is done.
#pragma once

#include <cstdint>
#include <cuda.h>

#include "../common/kv_producer.cuh"
#include "../common/params.h"
#include "../common/ptx.cuh"
#include "../common/scheduler.h"
#include "config.h"

namespace jax_mla::sm100 {

template <typename Element>
__device__ __forceinline__ void producer_main(SharedStorage<Element>& s, const DecodeParams& p, const CUtensorMap* q_map,
                                              const CUtensorMap* kv_map, const int32_t* part_info,
                                              const int32_t* split_offsets, int m_block) {
  DecodeKVProducer<Element, kNumKvStages> producer{&s.kv_bars, &s.kv[0][0][0], {}};
  const int log2_page = 31 - __clz(p.page_size);
  int piece_count = 0;
  for (int r = part_info[kPartBeginReq]; r <= part_info[kPartEndReq]; ++r) {
    const PieceOfWork w = piece_of(part_info, split_offsets, p.seq_lens, r);
    if (w.begin_block >= w.end_block) continue;

    // Q of this request's row block, once the previous piece's Q K^T MMAs no longer read it.
    ptx::mbarrier_wait(&s.q_empty, (piece_count & 1) ^ 1);
    ptx::mbarrier_arrive_expect_tx(&s.q_full, kKvTileBytes);
    const int q_row = r * p.rows + m_block * kBM;
#pragma unroll 1
    for (int box = 0; box < kKvBoxesQK; ++box) {
      ptx::tma_load_2d(&s.q[box][0], q_map, &s.q_full, box * kKvBoxCols, q_row);
    }

    const PagedKV kv{kv_map,
                     p.block_table + static_cast<int64_t>(r) * p.max_pages,
                     p.seq_lens[r],
                     p.page_size,
                     log2_page,
                     p.num_pages,
                     p.max_pages,
                     p.num_pages * p.page_size};
#pragma unroll 1
    for (int blk = w.begin_block; blk < w.end_block; ++blk) {
      const auto source = producer.locate_tile(kv, blk * kBN);  // block-table reads overlap the wait
      producer.acquire();
      // Per-stage flag, written before the tile's arrivals (release): whoever acquires the stage's
      // full barriers for this tile sees it. The softmax warpgroup folds it into the piece's result.
      s.tile_bad[producer.state.stage] = source.ok ? 0 : 1;
      producer.load_tile(kv, source);
      producer.commit_step();
    }
    ++piece_count;
  }
}

}  // namespace jax_mla::sm100
