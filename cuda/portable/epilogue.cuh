// Portable kernel: the epilogue of a piece: full row sums, normalisation, and the store of this
// warp's O[16 rows, 128 columns] either as the final output (a request of one piece) or as a
// split-KV partial (fp32, normalised by its own sum) at the piece's slot for the combine kernel,
// plus the LSE.
#pragma once

#include <cstdint>

#include "../common/config.h"
#include "../common/problem.h"
#include "../common/row_math.cuh"
#include "../common/work_iterator.h"
#include "config.h"
#include "mma_tiles.cuh"
#include "softmax.cuh"

namespace jax_mla::portable {

// dst_row0: row 0 of this warp's 16 rows in a (rows, 512) array of Out (Element: final output,
// float: partial); lse_row0 likewise in (rows,). Writes the first rows_valid rows (padding rows of
// the last row block are dropped). Only warp quarter 0 writes the LSE.
template <typename Out>
__device__ __forceinline__ void store_rows(const OTile& o, const SoftmaxState& st, bool bad, int rows_valid, int wq,
                                           int lane, Out* dst_row0, float* lse_row0) {
  const int g = lane / 4, t = lane % 4;
  const float total[2] = {quad_sum(st.l[0]), quad_sum(st.l[1])};
  const RowResult res = finish_rows(st.m, total, bad);
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = g + 8 * i;
    if (r >= rows_valid) continue;
    Out* dst = dst_row0 + static_cast<int64_t>(r) * kHeadDimV + wq * kColsPerWarp + 2 * t;
#pragma unroll
    for (int n = 0; n < kOTiles; ++n) {
      const float v0 = o[n][2 * i] * res.inv_sum[i];
      const float v1 = o[n][2 * i + 1] * res.inv_sum[i];
      if constexpr (std::is_same_v<Out, float>) {
        *reinterpret_cast<float2*>(dst + 8 * n) = make_float2(v0, v1);
      } else {
        *reinterpret_cast<uint32_t*>(dst + 8 * n) = pack2<Out>(v0, v1);
      }
    }
    if (wq == 0 && t == 0) lse_row0[r] = res.lse[i];
  }
}

// Piece w's output rows of this warp: rows [warp_row0, warp_row0 + 16) of the request (of which
// warp_rows exist); bad: the piece read an invalid page (NaN output).
template <typename Element>
__device__ __forceinline__ void store_piece(const DecodeProblem& p, const PieceOfWork& w, const OTile& o,
                                            const SoftmaxState& st, bool bad, int warp_rows, int wq, int lane,
                                            int warp_row0) {
  if (w.num_splits == 1) {
    const int64_t request_row0 = static_cast<int64_t>(w.request) * p.rows;  // in (b * rows)
    store_rows<Element>(o, st, bad, warp_rows, wq, lane,
                        static_cast<Element*>(p.out) + (request_row0 + warp_row0) * kHeadDimV,
                        p.lse + request_row0 + warp_row0);
  } else {
    const int64_t slot_row0 = static_cast<int64_t>(w.slot) * p.rows + warp_row0;  // in (slots * rows)
    store_rows<float>(o, st, bad, warp_rows, wq, lane, p.partial_out + slot_row0 * kHeadDimV,
                      p.partial_lse + slot_row0);
  }
}

}  // namespace jax_mla::portable
