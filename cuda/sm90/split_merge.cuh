// SM90 role: the in-kernel merge of split-KV partials (LaunchPlan::fused_merge, launch_plan.h: used
// wherever it fits; the combine kernel merges the other calls).
//
// Without it, every piece of a split request stores its fp32 partial (O normalised by its own sum,
// and its LSE) and a second kernel (cuda/common/combine.cu) merges them once the whole decode grid
// has drained. At small batch that second kernel is about a third of a call (b16/1K: ~10 us of
// ~35 on ncu; docs/performance.md), most of it latency: the grid drain, the launch, the ramp, the
// dependent LSE -> partial loads. Here the n CTAs holding the pieces of one (request, row block)
// instead wait for each other and merge 1/n of its rows each, right after their own store, while
// the partials are still in L2:
//   1. each CTA stores its partial as before, then one thread adds 1 to the (request, row block)
//      counter with release semantics (after a barrier of both consumers: CUTLASS's split-K
//      semaphore pattern);
//   2. that thread spins until the counter reaches n (acquire), a second barrier releases the rest;
//   3. piece j (its slot - split_offsets[r]) merges rows [j R, j R + R), R = ceil(rows / n), with
//      the arithmetic of lse_merge.h (same NaN / -inf rules), and writes the output rows and their LSE.
// Waiting on other CTAs needs every CTA of the grid resident at once: the launcher turns this on
// only when the grid is at most one CTA per SM (launch_plan.h fused_merge_fits), and the wait has a time bound
// (kMergeTimeoutNs) that traps instead of hanging. The counters (b, row blocks) are zeroed before
// the kernel by the scheduler kernel, or by a memset when the call was given a precomputed
// schedule (cuda/ffi/decode_launch.cu). Requests with no piece (seq_len <= 0) are written by the
// producer warpgroup's idle warps at the start (write_empty_requests).
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "../common/config.h"
#include "../common/problem.h"
#include "../common/ptx.cuh"
#include "../common/lse_merge.h"
#include "../common/row_math.cuh"
#include "../common/scheduler.h"
#include "../common/work_iterator.h"
#include "config.h"
#include "launch_plan.h"
#include "softmax.cuh"

namespace jax_mla::sm90 {

inline constexpr int kMergeWarps = kConsumerThreads / 32;          // 8: both consumers
// Splits a row may have (num_splits <= num_parts in every plan; scheduler.h caps the batch-invariant
// plan's chunks at num_parts): lane l holds the LSEs of splits l + 32 k.
inline constexpr int kMergeLseRegs = 5;
static_assert(32 * kMergeLseRegs == kFusedMergeMaxParts, "launch_plan.h's part limit is what the merge can hold");
// A wait longer than this is a bug (or CTAs that cannot all be resident): trap, do not hang.
inline constexpr uint64_t kMergeTimeoutNs = 10ull * 1000 * 1000 * 1000;

// Both consumers (256 threads, `thread` 0..255): this CTA's partial of the (request, row block) is
// stored; add its arrival to the counter. Never waits, so a CTA's later pieces go on at once.
__device__ __forceinline__ void arrive_piece(int* counter, int thread) {
  ptx::named_barrier_sync(kBarRowSum, kConsumerThreads);  // every partial store of the CTA is issued
  if (thread == 0) ptx::red_release_gpu_add(counter, 1);
}

// Both consumers: wait until all n pieces of the (request, row block) have arrived.
__device__ __forceinline__ void wait_pieces(const int* counter, int n, int thread) {
  if (thread == 0) {
    const uint64_t t0 = ptx::global_timer_ns();
    while (ptx::ld_acquire_gpu(counter) < n) {
      if (ptx::global_timer_ns() - t0 > kMergeTimeoutNs) __trap();
    }
  }
  ptx::named_barrier_sync(kBarRowSum, kConsumerThreads);
}

// Merges rows [row_begin, row_end) (rows of the request) over its n pieces at workspace slots
// first_slot .. first_slot + n - 1. The 8 warps take kMergeWarps / kWarpsPerRow rows at a time, each
// row by kWarpsPerRow warps sharing its 512 columns; a lane holds kColsPerLane of them as vectors
// of kVec floats, vector j of lane l at column part * kColsPerWarp + (32 j + l) kVec (coalesced).
// The row's weights (lse_merge.h) are computed by its own warps only, so few warps per row
// means little repeated work: with one warp per row a row costs about (loads + 16 FMA) per split
// and lane, against 8x the LSE loads, reductions and exps when all warps share every row (that
// layout spent 4.7 M of the kernel's 9.8 M warp instructions at b16/1K on an H100, ncu,
// 2026-12-06). U splits' loads per row are in flight together: every load of a round is issued
// before the first is used.
template <typename Element, int kWarpsPerRow, int U>
__device__ __forceinline__ void merge_rows(const DecodeProblem& p, int request, int row_begin, int row_end,
                                           int first_slot, int n, int thread) {
  constexpr int kRowsAtOnce = kMergeWarps / kWarpsPerRow;
  constexpr int kColsPerWarp = kHeadDimV / kWarpsPerRow;
  constexpr int kColsPerLane = kColsPerWarp / 32;
  constexpr int kVec = kColsPerLane < 4 ? kColsPerLane : 4;
  constexpr int kVecs = kColsPerLane / kVec;
  static_assert(kMergeWarps % kWarpsPerRow == 0 && (kVec == 2 || kVec == 4) && kVecs * kVec == kColsPerLane,
                "a lane's columns are whole float2 / float4 vectors");
  using Vec = std::conditional_t<kVec == 4, float4, float2>;
  const int lane = thread % 32;
  const int warp = __shfl_sync(0xffffffff, thread / 32, 0);  // warp-uniform for ptxas (see merge_piece_rows)
  const int row_lane = warp / kWarpsPerRow, part = warp % kWarpsPerRow;
  const int64_t rows = p.rows;
  const int64_t split_stride = rows * kHeadDimV;
  const int col0 = part * kColsPerWarp + lane * kVec;
  for (int row = row_begin + row_lane; row < row_end; row += kRowsAtOnce) {
    const float* lse_col = p.partial_lse + static_cast<int64_t>(first_slot) * rows + row;
    const float* src = p.partial_out + (static_cast<int64_t>(first_slot) * rows + row) * kHeadDimV + col0;
    float l[kMergeLseRegs];  // (k): LSE of split lane + 32 k
    Vec v[U][kVecs];         // (split of the round, vector)
    // Splits base .. base + U - 1: this lane's vectors of each (zero past the last split).
    auto load_round = [&](int base) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
#pragma unroll
        for (int j = 0; j < kVecs; ++j) {
          v[u][j] = base + u < n
                        ? __ldcg(reinterpret_cast<const Vec*>(src + (base + u) * split_stride + 32 * j * kVec))
                        : Vec{};
        }
      }
    };
#pragma unroll
    for (int k = 0; k < kMergeLseRegs; ++k) {
      const int s = lane + 32 * k;
      l[k] = s < n ? __ldcg(lse_col + s * rows) : -INFINITY;
    }
    load_round(0);  // issued with the LSE loads, before the reductions use them
    float w[kMergeLseRegs];  // exp(l[k] - m), shuffled to the lanes below
    const RowWeights rw = row_weights_of(l, w);
    float acc[kVecs][kVec] = {};  // (vector, element)
    for (int base = 0; base < n; base += U) {
      if (base > 0) load_round(base);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int s = base + u;
        if (s < n) {  // split s's weight sits in lane s % 32, register s / 32 (kMergeLseRegs of them)
          const int k = s >> 5;
          float wk = w[0];
#pragma unroll
          for (int kk = 1; kk < kMergeLseRegs; ++kk) wk = k == kk ? w[kk] : wk;  // a select, no local array
          const float ws = __shfl_sync(0xffffffff, wk, s & 31) * rw.inv;
#pragma unroll
          for (int j = 0; j < kVecs; ++j) {
            const float* x = reinterpret_cast<const float*>(&v[u][j]);
#pragma unroll
            for (int e = 0; e < kVec; ++e) acc[j][e] = fmaf(ws, x[e], acc[j][e]);
          }
        }
      }
    }
    const int64_t out_row = static_cast<int64_t>(request) * rows + row;
    Element* dst = static_cast<Element*>(p.out) + out_row * kHeadDimV + col0;
#pragma unroll
    for (int j = 0; j < kVecs; ++j) {
      uint32_t packed[kVec / 2];
#pragma unroll
      for (int e = 0; e < kVec / 2; ++e) {
        packed[e] = pack2<Element>(rw.bad ? NAN : acc[j][2 * e], rw.bad ? NAN : acc[j][2 * e + 1]);
      }
      if constexpr (kVec == 4) {
        *reinterpret_cast<uint2*>(dst + 32 * j * kVec) = make_uint2(packed[0], packed[1]);
      } else {
        *reinterpret_cast<uint32_t*>(dst + 32 * j * kVec) = packed[0];
      }
    }
    if (part == 0 && lane == 0) p.lse[out_row] = merged_lse(rw);
  }
}

// Piece `piece` (0 .. n - 1) of a (request, row block) with rows_valid rows, after every piece has
// arrived: merge its share of the rows, R = ceil(rows_valid / n) of them. Many rows per piece
// (b16/1K: 16 of 64 over 4 pieces): one warp per row, 8 rows at a time, 4 splits' loads in flight;
// a few: two warps per row; one row (b1/32K: 64 pieces): all 8 warps on it, 32 splits in flight.
template <typename Element>
__device__ __forceinline__ void merge_piece_rows(const DecodeProblem& p, int request, int m_block, int rows_valid,
                                                 int first_slot, int n, int piece, int thread) {
  // Loaded values are per-thread to ptxas: shuffled from lane 0, the loops and branches below are
  // provably warp-uniform, which keeps ptxas from serialising the kernel's wgmmas (C7520).
  n = __shfl_sync(0xffffffff, n, 0);
  first_slot = __shfl_sync(0xffffffff, first_slot, 0);
  piece = __shfl_sync(0xffffffff, piece, 0);
  request = __shfl_sync(0xffffffff, request, 0);
  const int per = (rows_valid + n - 1) / n;
  const int begin = m_block * kBlockM + min(rows_valid, piece * per);
  const int end = m_block * kBlockM + min(rows_valid, piece * per + per);
  if (begin >= end) return;
  if (per >= 6) {
    merge_rows<Element, 1, 4>(p, request, begin, end, first_slot, n, thread);
  } else if (per >= 2) {
    merge_rows<Element, 2, 8>(p, request, begin, end, first_slot, n, thread);
  } else {
    merge_rows<Element, 8, 32>(p, request, begin, end, first_slot, n, thread);
  }
}

// The combine list's requests with no piece (seq_len <= 0): out = 0 and lse = -inf, or NaN for a
// negative (invalid) length, as combine.cu writes them. CTA `cta` of `num_ctas` takes list entries
// cta, cta + num_ctas, ...; `thread` 0 .. num_threads - 1 of the calling warps.
template <typename Element>
__device__ __forceinline__ void write_empty_requests(const DecodeProblem& p, int cta, int num_ctas, int thread,
                                                     int num_threads) {
  const int32_t* split_offsets = p.schedule + split_offsets_begin(p.num_parts);  // (b + 1)
  const int32_t* combine = p.schedule + combine_begin(p.batch, p.num_parts);     // (kCombineHeader + b)
  const int num_listed = min(max(combine[kCombineCount], 0), p.batch);
  for (int i = cta; i < num_listed; i += num_ctas) {
    const int r = combine[kCombineHeader + i];
    if (r < 0 || r >= p.batch || split_offsets[r + 1] != split_offsets[r]) continue;
    const bool bad = p.seq_lens[r] < 0;
    const float x = bad ? NAN : 0.f;
    const uint32_t pair = pack2<Element>(x, x);
    const int64_t row0 = static_cast<int64_t>(r) * p.rows;
    uint32_t* dst = reinterpret_cast<uint32_t*>(static_cast<Element*>(p.out) + row0 * kHeadDimV);  // (rows, 256) pairs
    for (int64_t e = thread; e < static_cast<int64_t>(p.rows) * (kHeadDimV / 2); e += num_threads) dst[e] = pair;
    for (int row = thread; row < p.rows; row += num_threads) p.lse[row0 + row] = bad ? NAN : -INFINITY;
  }
}

// The (request, row block) arrival counter: plan.merge_counters is (b, ceil(rows / 64)) int32.
__device__ __forceinline__ int* merge_counter(const LaunchPlan& plan, const DecodeProblem& p, int request, int m_block) {
  return plan.merge_counters + static_cast<int64_t>(request) * num_row_blocks(p.rows) + m_block;
}

// Both consumers, after the CTA's last piece: for each split piece of the part, wait for the
// request's other pieces and merge this piece's share of the rows. In the default plans only the
// part's first and last request can be split (the requests between lie wholly inside it); in the
// batch-invariant plan any piece can, and several pieces of one request can sit in this part (each
// merges its own share; every piece of the CTA arrived in its epilogue before the first wait, so
// no CTA waits on itself). Nothing is carried through the piece loop (registers there are the
// wgmma accumulators'); the schedule entries are re-read (L1 hits).
template <typename Element>
__device__ __forceinline__ void merge_split_pieces(const DecodeProblem& p, const LaunchPlan& plan, const PartWork& work,
                                                   int m_block, int rows_valid, int thread) {
  if (work.chunked()) {
    work.for_each_piece([&](const PieceOfWork& w, int) {
      if (w.num_splits <= 1) return;
      const int first_slot = work.split_offsets[w.request];
      wait_pieces(merge_counter(plan, p, w.request, m_block), w.num_splits, thread);
      merge_piece_rows<Element>(p, w.request, m_block, rows_valid, first_slot, w.num_splits, w.slot - first_slot,
                                thread);
    });
    return;
  }
  const int first = work.first_request(), last = work.last_request();
#pragma unroll 1
  for (int k = 0; k < 2; ++k) {
    const int r = k == 0 ? first : last;
    if (r > last || (k == 1 && last == first)) continue;  // empty part, or one request: visited once
    const PieceOfWork w = work.piece(r);
    if (w.empty() || w.num_splits <= 1) continue;
    const int first_slot = work.split_offsets[r];
    wait_pieces(merge_counter(plan, p, r, m_block), w.num_splits, thread);
    merge_piece_rows<Element>(p, r, m_block, rows_valid, first_slot, w.num_splits, w.slot - first_slot, thread);
  }
}

}  // namespace jax_mla::sm90
