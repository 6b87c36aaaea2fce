// Portable kernel: the main loop, run by every thread of the CTA (no warp specialisation). See
// config.h for the CTA layout and the budgets, and docs/design.md for the semantics.
//
// The CTA walks the pieces of work of its part of the split-KV schedule (work_iterator.h) for its
// 32 query rows, 32 tokens (one sub-tile, one stage) at a time; the loader (producer.cuh) walks the
// same pieces two sub-tiles ahead. Per sub-tile j (stage j % 2):
//   wait for stage j (cp.async group j), __syncthreads
//   Q K^T partials (each warp 9 k-steps)      -> named barrier of the row group (partials written)
//   sum of the 4 partials, scale, mask, online softmax, O rescale, P V (every warp of the group)
//   __syncthreads (every warp is done reading stage j % 2), then the loader issues sub-tile j + 2
//   into it, so sub-tile j + 1 is in flight during the whole computation of j.
// A sub-tile that starts at or past seq_len (the second half of a request's last block) holds no
// key: its copies are zero fills and its computation is skipped (it would leave O, m and l as they
// are). The loop has the same barriers either way. After a piece's last sub-tile: the epilogue
// (epilogue.cuh).
//
// FP8 cache (config.h): sub-tile j's raw rows land in raw stage j % 2 and the single 16-bit stage
// takes the dequantized sub-tile:
//   wait for raw stage j, __syncthreads (also: every warp is done with sub-tile j - 1's 16-bit stage)
//   dequantize raw -> 16-bit stage, __syncthreads, the loader issues sub-tile j + 2 into the raw stage
//   Q K^T, softmax, P V on the 16-bit stage, as above (no barrier after: the next wait's covers it).
#pragma once

#include <cmath>
#include <cstdint>
#include <cuda_runtime.h>

#include "../common/config.h"
#include "../common/problem.h"
#include "../common/work_iterator.h"
#include "config.h"
#include "epilogue.cuh"
#include "mma.cuh"
#include "mma_tiles.cuh"
#include "producer.cuh"
#include "softmax.cuh"

namespace jax_mla::portable {

// Rows [32 m_block, 32 m_block + 32) of every piece of `work`.
template <typename Element, KvFormat kFormat>
__device__ __forceinline__ void mainloop(Storage<Element, kFormat>& s, const DecodeProblem& p, const PartWork& work,
                                         int m_block) {
  constexpr bool kFp8 = kFormat == KvFormat::kFp8;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rg = warp / kWarpsPerRowGroup;  // row group: rows [16 rg, 16 rg + 16) of the block
  const int wq = warp % kWarpsPerRowGroup;  // k-steps {4 b + wq} of Q K^T, columns [128 wq, +128) of O
  const int g = lane / 4, t = lane % 4;
  const int block_row0 = m_block * kBlockRows;
  const int rows_valid = min(kBlockRows, p.rows - block_row0);  // rows of this block that exist
  const int warp_rows = rows_valid - 16 * rg;                   // ... from this warp's first row on
  const float scale_log2 = p.softmax_scale * 1.4426950408889634f;

  KvLoader<Element, kFormat> loader;
  loader.init(p, work, s);
  loader.issue(0);
  loader.issue(1);

  int j = 0;      // sub-tiles consumed so far in this part (stage j % 2)
  work.for_each_piece([&](const PieceOfWork& w, int piece) {  // piece: the loader's piece ordinal
    const int seq_len = work.seq_len(w);

    int visible[2];  // keys rows g and g + 8 of this warp may see
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int row = block_row0 + 16 * rg + g + 8 * i;
      visible[i] = row < p.rows ? visible_keys(seq_len, p.seq_q, row / p.heads_q, p.causal) : seq_len;
    }
    const int visible_min = min(visible[0], visible[1]);

    QFragments qf;
    const int64_t request_row0 = static_cast<int64_t>(w.request) * p.rows;  // in (b * rows)
    load_q<Element>(p, request_row0 + block_row0 + 16 * rg, warp_rows, wq, lane, qf);
    OTile o;
#pragma unroll
    for (int n = 0; n < kOTiles; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[n][e] = 0.f;
    SoftmaxState st{{-INFINITY, -INFINITY}, {0.f, 0.f}};

#pragma unroll 1
    for (int sub = w.begin_block * kTilesPerBlock; sub < w.end_block * kTilesPerBlock; ++sub, ++j) {
      const int stage = j % kStages;
      cp_async_wait<kStages - 1>();  // this thread's copies of sub-tile j landed
      __syncthreads();               // ... and everybody else's
      const int first_token = sub * kTileKeys;
      int kv_stage = stage;  // the 16-bit stage the tensor-core work reads
      if constexpr (kFp8) {
        if (first_token < seq_len) loader.dequantize(stage, s);
        __syncthreads();       // the 16-bit stage is complete; raw stage j % 2 no longer read
        loader.issue(stage);   // raw sub-tile j + 2
        kv_stage = 0;
      }
      if (first_token < seq_len) {  // uniform over the CTA
        ScoreTile sc;
        partial_scores<Element>(s, kv_stage, qf, wq, lane, sc);
        sum_partial_scores<Element>(s, rg, wq, lane, sc);
        float row_max[2], alpha[2];
        scale_and_mask(sc, scale_log2, first_token, visible, visible_min, t, row_max);
        online_softmax(sc, row_max, st, alpha);
        rescale_o(o, alpha);
        uint32_t pa[kTileKeys / 16][4];
        p_fragments<Element>(sc, pa);
        accumulate_pv<Element>(s, kv_stage, pa, wq, lane, o);
      }
      if constexpr (!kFp8) {
        __syncthreads();  // stage j % 2 (and partial_scores) no longer read
        loader.issue(stage);
      }
    }

    // Every thread saw its own tokens' pages; a bad page anywhere makes the piece NaN.
    const bool bad = __syncthreads_or(loader.take_bad(piece)) != 0;
    store_piece<Element>(p, w, o, st, bad, warp_rows, wq, lane, block_row0 + 16 * rg);
  });
}

}  // namespace jax_mla::portable
