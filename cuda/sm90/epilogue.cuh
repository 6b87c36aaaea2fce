// SM90 role: the consumers' epilogue, once per piece after its last wgmma completed. The two
// consumers' partial row sums meet in shared memory (each consumer summed only its own tiles' P),
// then each normalises its half of O and writes either the final output (a request of one piece)
// or the piece's split-KV partial at its workspace slot, for the in-kernel merge (split_merge.cuh)
// or the combine kernel (cuda/common/combine.cu).
#pragma once

#include <cmath>
#include <cstdint>

#include "../common/config.h"
#include "../common/problem.h"
#include "../common/ptx.cuh"
#include "../common/row_math.cuh"
#include "../common/work_iterator.h"
#include "config.h"
#include "launch_plan.h"
#include "softmax.cuh"
#include "split_merge.cuh"

namespace jax_mla::sm90 {

// o: (64, 256) fragment of columns [col0, col0 + 256). Writes rows < rows_valid.
// dst_row0 points at row 0 of this CTA's 64-row block: (rows, 512) elements of Element (final output)
// or float (partial).
template <typename Out>
__device__ __forceinline__ void store_o(const float (&o)[128], const RowResult& res, const RowCoords& rc,
                                        int rows_valid, int col0, Out* dst_row0) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (rc.row[i] >= rows_valid) continue;
    Out* dst = dst_row0 + static_cast<int64_t>(rc.row[i]) * kHeadDimV + col0 + rc.quad_col;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const float v0 = o[4 * j + 2 * i] * res.inv_sum[i];
      const float v1 = o[4 * j + 2 * i + 1] * res.inv_sum[i];
      if constexpr (std::is_same_v<Out, float>) {
        *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(v0, v1);
      } else {
        *reinterpret_cast<uint32_t*>(dst + 8 * j) = pack2<Out>(v0, v1);
      }
    }
  }
}

// Both consumers, piece w (ordinal: its position in the CTA's pieces): this consumer's o (64, 256),
// columns [256 consumer, +256), and its row state rs. Rows >= rows_valid are not written.
// merge_thread: 0..255 over both consumers (the merge's arrival).
template <typename Element>
__device__ __forceinline__ void store_piece(SharedStorage<Element>& s, const DecodeProblem& p, const LaunchPlan& plan,
                                            const PieceOfWork& w, int ordinal, int m_block, int rows_valid,
                                            int consumer, const RowCoords& rc, const RowState& rs,
                                            const float (&o)[128], int merge_thread) {
  const int thread = threadIdx.x % 128;
  const int parity = ordinal & 1;
  float total[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float mine = quad_sum(rs.l[i]);
    if ((thread & 3) == 0) s.row_sum[parity][consumer][rc.row[i]] = mine;
  }
  ptx::named_barrier_sync(kBarRowSum, kConsumerThreads);
#pragma unroll
  for (int i = 0; i < 2; ++i) total[i] = s.row_sum[parity][0][rc.row[i]] + s.row_sum[parity][1][rc.row[i]];
  const bool bad = s.bad_request[ordinal & (kBadFlagSlots - 1)] != 0;
  const RowResult res = finish_rows(rs.m, total, bad);

  const int64_t row0 = static_cast<int64_t>(w.request) * p.rows + m_block * kBlockM;  // in (b * rows)
  const int col0 = consumer * kColsPerConsumer;
  if (w.num_splits == 1) {
    store_o(o, res, rc, rows_valid, col0, static_cast<Element*>(p.out) + row0 * kHeadDimV);
    if (consumer == 0 && (thread & 3) == 0) {
#pragma unroll
      for (int i = 0; i < 2; ++i)
        if (rc.row[i] < rows_valid) p.lse[row0 + rc.row[i]] = res.lse[i];
    }
  } else {
    const int64_t prow0 = static_cast<int64_t>(w.slot) * p.rows + m_block * kBlockM;  // in (slots * rows)
    store_o(o, res, rc, rows_valid, col0, p.partial_out + prow0 * kHeadDimV);
    if (consumer == 0 && (thread & 3) == 0) {
#pragma unroll
      for (int i = 0; i < 2; ++i)
        if (rc.row[i] < rows_valid) p.partial_lse[prow0 + rc.row[i]] = res.lse[i];
    }
    if (plan.fused_merge) {  // split_merge.cuh: arrive now, merge our share after the last piece
      arrive_piece(merge_counter(plan, p, w.request, m_block), merge_thread);
    }
  }
}

}  // namespace jax_mla::sm90
