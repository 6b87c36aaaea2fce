// Split-KV schedule: which (request, KV block) ranges each "SM part" processes.
//
// Shared, bit for bit, by the CPU kernel (computed on the host thread) and the GPU kernels
// (computed by the device-side scheduler kernel in scheduler.cu, no host sync, so it can sit
// inside a CUDA graph). The schedule is a plain int32 array so that JAX can carry it between
// layers of one decode step (jax_mla.decode_schedule) without knowing its meaning.
//
// Cost model: request r costs nb(r) + kFixedOverheadBlocks units, nb(r) = ceil(seq_len/kBlockN)
// (0 for an empty request, which costs nothing): every piece of work a part does pays the
// overhead (Q load, pipeline fill, epilogue) once, then one unit per KV block. Two ways to cut the
// batch into parts (PartPlan, chosen by choose_part_plan):
//  - The line (the general case): laying the requests' costs end to end gives a line [0, total);
//    part p owns the cost interval [p*W, (p+1)*W), W = ceil(total/num_parts), or the
//    whole-request width of part_width() below when the batch is uniform. Inside request r the
//    first kFixedOverheadBlocks units are its overhead, then one unit per KV block, so part p
//    processes exactly the blocks whose unit falls in its interval. The line charges a request's
//    overhead once, but a part that starts inside a request pays it again, so its most expensive
//    part costs up to W + overhead.
//  - Pieces (few non-empty requests, at most num_parts): request r is cut into
//    ceil(nb(r) / B) pieces of (almost) equal block counts, one piece per part, parts in request
//    order; B is the smallest block count for which all pieces fit in the parts. Every part then
//    costs at most B + overhead. Where W is small against the overhead this is much less: b16/1K
//    over 66 parts has W = 6 and parts of up to 6 + 5 units on the line, 4 + 5 with pieces. Where
//    it is not, pieces still cut requests more evenly: b32/h64/4K over 132 parts is 4 pieces of 16
//    blocks per request, against 4 or 5 pieces on the line (152 partials instead of 128).
// Every function below is a closed form over the prefix sums C[r] and split_offsets (no
// sequential walk), which is what lets the GPU compute it with one thread per part / per request.
//
// Layout of the schedule array (int32, schedule_size(b, num_parts) elements):
//   [0, num_parts * kPartFields)            PartInfo of part p at p * kPartFields
//   [split_offsets_begin, ... + b + 1)      split_offsets: request r's partial results live in
//                                           workspace slots split_offsets[r] .. split_offsets[r+1]-1;
//                                           split_offsets[b] = total number of slots used.
//   [combine_begin, ... + kCombineHeader + b)  the combine's work list:
//       [kCombineCount]      number of listed requests: those with num_splits != 1
//       [kCombineManyCount]  how many of them have num_splits > kManySplits
//       then b entries: first the kCombineManyCount requests with num_splits > kManySplits, in
//       increasing order, then the other listed ones (num_splits 0 or 2 .. kManySplits), in
//       increasing order; entries past kCombineCount are -1.
// A request with exactly one split writes its final output directly; with several, each part
// writes a partial (O normalised by its own sum, plus its LSE) and the combine step merges them;
// with none (seq_len <= 0) the combine step writes O = 0 and LSE = -inf (NaN for a negative
// length, which is an invalid request). The list lets the combine kernel size its work to the
// requests that need it (often few: b = 128 at 4K has ~60 split requests, b = 1 at 32K one
// request with 65 splits) instead of visiting every request; the two classes get different work
// shapes there (cuda/common/combine.cu).
#pragma once

#include <cstdint>

#include "config.h"

namespace jax_mla {

// Fields of one part, at schedule[p * kPartFields + field].
enum PartField : int {
  kPartBeginReq = 0,    // first request touched
  kPartBeginBlock = 1,  // first KV block (in units of kBlockN tokens) of begin_req
  kPartEndReq = 2,      // last request touched (inclusive); < begin_req for an empty part
  kPartEndBlock = 3,    // one past the last KV block of end_req
  kPartBeginSlot = 4,   // workspace slot of begin_req's piece (others use split_offsets[r])
  kPartFields = 8,      // padded to 32 bytes
};

// Header of the combine list, at schedule[combine_begin(b, num_parts) + field].
enum CombineField : int {
  kCombineCount = 0,      // requests listed (num_splits != 1)
  kCombineManyCount = 1,  // of those, the first ones: num_splits > kManySplits
  kCombineHeader = 2,     // the b list entries follow
};

// Requests split into more pieces than this are "many-split": the combine kernel spreads each of
// their rows over the warps of a CTA (split loop in parallel), the others get one warp per row.
// Part of the schedule format (the list is ordered by it), so host and device agree on it.
inline constexpr int kManySplits = 8;

MLA_HOST_DEVICE int64_t split_offsets_begin(int64_t num_parts) { return num_parts * kPartFields; }
MLA_HOST_DEVICE int64_t combine_begin(int64_t batch, int64_t num_parts) {
  return split_offsets_begin(num_parts) + batch + 1;
}
MLA_HOST_DEVICE int64_t schedule_size(int64_t batch, int64_t num_parts) {
  return combine_begin(batch, num_parts) + kCombineHeader + batch;
}

// Most workspace slots any schedule over `batch` requests and `num_parts` parts can use:
// each part boundary splits at most one request into one more piece.
MLA_HOST_DEVICE int64_t max_splits(int64_t batch, int64_t num_parts) { return batch + num_parts; }

MLA_HOST_DEVICE int num_kv_blocks(int seq_len) { return seq_len <= 0 ? 0 : (seq_len + kBlockN - 1) / kBlockN; }

MLA_HOST_DEVICE int request_cost(int seq_len) {
  const int nb = num_kv_blocks(seq_len);
  return nb == 0 ? 0 : nb + kFixedOverheadBlocks;
}

// Units per part for a total cost (at least one unit so that parts make progress).
MLA_HOST_DEVICE int64_t units_per_part(int64_t total, int num_parts) {
  const int64_t w = (total + num_parts - 1) / num_parts;
  return w < 1 ? 1 : w;
}

// Whole-request parts: a part width may exceed ceil(total / num_parts) by at most 1/kWholeRequestSlack.
inline constexpr int kWholeRequestSlack = 20;

// The part width W. When every non-empty request costs the same c (a uniform batch: the common
// serving case and the benchmark's) and the next multiple of c above ceil(total / num_parts) is at
// most 5% wider, W is that multiple: every part then holds whole requests, so no request is split,
// the decode kernel writes no fp32 partials and the combine has nothing to merge. Measured on an
// H200 (docs/performance.md, 2026-12-04, whole-request parts): b128/4K with 64 parts (W = 2 x 69 units
// instead of 134) -2.6% per call, causal s_q = 2 with 32 parts -1.8%. The parts past
// ceil(total / W) stay empty. min_cost / max_cost: the smallest and largest request_cost over the
// non-empty requests (INT32_MAX and 0 when there are none).
MLA_HOST_DEVICE int64_t part_width(int64_t total, int num_parts, int min_cost, int max_cost) {
  const int64_t w = units_per_part(total, num_parts);
  if (max_cost <= 0 || min_cost != max_cost) return w;
  const int64_t whole = (w + max_cost - 1) / max_cost * max_cost;
  return (whole - w) * kWholeRequestSlack <= w ? whole : w;
}

// How the parts cut the batch (see the cost model above): the line, or pieces where they apply
// (1 .. num_parts non-empty requests) and their most expensive part costs no more than the line's
// (pieces_preferred).
struct PartPlan {
  int64_t width;     // the line's units per part W (computed in both modes; used by the line)
  int piece_blocks;  // pieces: at most this many KV blocks per piece (B >= 1); 0: the line
};

// The non-empty requests' costs, summarised (the device scheduler reduces them over its threads).
struct CostSummary {
  int min_cost;  // smallest request_cost over the non-empty requests (INT32_MAX when none)
  int max_cost;  // largest (0 when none)
  int nonempty;  // how many requests are non-empty
};

// Pieces of a request of nb KV blocks with at most piece_blocks blocks each.
MLA_HOST_DEVICE int pieces_of(int nb, int piece_blocks) { return (nb + piece_blocks - 1) / piece_blocks; }

// Where the smallest feasible B lies: [lo, hi], lo > hi when pieces do not apply. The pieces of
// all requests number at least total_blocks / B (so B >= total_blocks / num_parts) and at most
// total_blocks / B + nonempty (so B = total_blocks / (num_parts - nonempty) fits), and B = the
// largest request's block count always fits when nonempty <= num_parts.
struct PieceRange {
  int lo, hi;
};
MLA_HOST_DEVICE PieceRange piece_blocks_range(int64_t total_blocks, int nonempty, int max_blocks, int num_parts) {
  if (nonempty == 0 || nonempty > num_parts) return {1, 0};
  int64_t hi = max_blocks;
  if (nonempty < num_parts) {
    const int64_t spare = num_parts - nonempty;
    const int64_t fits = (total_blocks + spare - 1) / spare;
    hi = fits < hi ? fits : hi;
  }
  int64_t lo = (total_blocks + num_parts - 1) / num_parts;
  lo = lo > hi ? hi : lo;
  return {static_cast<int>(lo < 1 ? 1 : lo), static_cast<int>(hi)};
}

// The line's most expensive part, estimated: W when its parts hold whole requests (uniform batch,
// part_width's whole-request width), else W plus the overhead a part starting inside a request pays.
MLA_HOST_DEVICE int64_t line_part_cost(int64_t width, const CostSummary& s) {
  const bool whole = s.max_cost > 0 && s.min_cost == s.max_cost && width % s.max_cost == 0;
  return whole ? width : width + kFixedOverheadBlocks;
}

// Pieces are chosen when their most expensive part costs no more than the line's estimate, ties
// included: pieces split requests into fewer, equal pieces and no part straddles two requests,
// which the cost model does not count. Measured on an H100 (docs/performance.md, 2026-12-06, the
// pieces split plan; each config in one process, pieces against line): b1/32K (13 units both) 1-3% faster,
// b32/h64/4K (21 against 22) 3-13%, b64/h16/8K (69 against 70) 2-5%, b16/1K (9 against 11) 1-4%.
MLA_HOST_DEVICE bool pieces_preferred(int64_t piece_blocks, int64_t line_cost) {
  return piece_blocks + kFixedOverheadBlocks <= line_cost;
}

// The plan for a batch of total_cost units. pieces_total(B) must return sum_r pieces_of(nb(r), B)
// over the non-empty requests; it is called only with B in piece_blocks_range (a binary search,
// ceil(log2(hi - lo + 1)) calls; the device scheduler's version is a reduction over its threads,
// so every one of them must reach the same calls: the arguments here are uniform).
template <class PiecesTotal>
MLA_HOST_DEVICE PartPlan choose_part_plan(int64_t total_cost, int num_parts, const CostSummary& s,
                                          PiecesTotal&& pieces_total) {
  PartPlan plan{part_width(total_cost, num_parts, s.min_cost, s.max_cost), 0};
  const int64_t total_blocks = total_cost - static_cast<int64_t>(s.nonempty) * kFixedOverheadBlocks;
  const PieceRange range = piece_blocks_range(total_blocks, s.nonempty, s.max_cost - kFixedOverheadBlocks, num_parts);
  if (range.lo > range.hi) return plan;
  const int64_t line_cost = line_part_cost(plan.width, s);
  if (!pieces_preferred(range.lo, line_cost)) return plan;  // not even the best B would win
  int lo = range.lo, hi = range.hi;                                  // pieces_total(hi) <= num_parts
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    if (pieces_total(mid) <= num_parts) hi = mid; else lo = mid + 1;
  }
  if (pieces_preferred(lo, line_cost)) plan.piece_blocks = lo;
  return plan;
}

// The request whose range of an exclusive prefix sum (length batch + 1) holds x: the largest r
// with prefix[r] <= x, so prefix[r] <= x < prefix[r + 1], a request with a non-empty range.
// Requires 0 <= x < prefix[batch].
template <class T>
MLA_HOST_DEVICE int request_holding(const T* prefix, int batch, int64_t x) {
  int lo = 0, hi = batch;  // answer in [lo, hi)
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (prefix[mid] <= x) lo = mid; else hi = mid;
  }
  return lo;
}

// Index of the request that owns cost unit x: C is the exclusive prefix sum of request_cost.
MLA_HOST_DEVICE int request_of_unit(const int64_t* C, int batch, int64_t x) { return request_holding(C, batch, x); }

// Line: the part holding the first KV block of request r (r must have nb(r) > 0).
MLA_HOST_DEVICE int64_t first_part_of(const int64_t* C, int r, int64_t w) {
  return (C[r] + kFixedOverheadBlocks) / w;
}

// Number of pieces (workspace slots) of the request whose cost units are [c_begin, c_end), written
// on the two prefix values directly so that the device scheduler can use the values it holds in
// registers. Line: the parts of its last and its first KV block, (c_end - 1) / W and first_part_of.
MLA_HOST_DEVICE int num_splits_planned(const PartPlan& plan, int64_t c_begin, int64_t c_end) {
  if (c_end == c_begin) return 0;
  if (plan.piece_blocks > 0) {
    return pieces_of(static_cast<int>(c_end - c_begin - kFixedOverheadBlocks), plan.piece_blocks);
  }
  return static_cast<int>((c_end - 1) / plan.width - (c_begin + kFixedOverheadBlocks) / plan.width + 1);
}

// Where request r goes in the combine list (-1: not listed, it has exactly one split).
// many_before / few_before: listed requests before r of the same class; num_many: the total of
// the many-split class (listed first).
MLA_HOST_DEVICE int combine_position(int num_splits, int many_before, int few_before, int num_many) {
  if (num_splits == 1) return -1;
  return num_splits > kManySplits ? many_before : num_many + few_before;
}

// KV block of request r at cost unit x, clamped to [0, nb]: units before the request's blocks
// (its overhead) map to block 0, units after its end to nb.
MLA_HOST_DEVICE int block_at_unit(const int64_t* C, int r, int64_t x) {
  const int64_t nb = C[r + 1] - C[r] - kFixedOverheadBlocks;
  int64_t b = x - C[r] - kFixedOverheadBlocks;
  b = b < 0 ? 0 : (b > nb ? nb : b);
  return static_cast<int>(b);
}

// Pieces: the request whose pieces hold part p (= slot p; empty requests own no slot).
// Requires p < split_offsets[batch].
MLA_HOST_DEVICE int request_of_slot(const int32_t* split_offsets, int batch, int p) {
  return request_holding(split_offsets, batch, p);
}

// Part p's PartInfo. split_offsets (b + 1) must be complete: with pieces, part p is slot p.
MLA_HOST_DEVICE void plan_part(const int64_t* C, const int32_t* split_offsets, int batch, const PartPlan& plan, int p,
                               int32_t* info) {
  for (int f = 0; f < kPartFields; ++f) info[f] = 0;
  const int64_t total = C[batch];
  const bool empty = plan.piece_blocks > 0 ? p >= split_offsets[batch] : static_cast<int64_t>(p) * plan.width >= total;
  if (empty) {
    info[kPartBeginReq] = batch;
    info[kPartEndReq] = batch - 1;
    return;
  }
  if (plan.piece_blocks > 0) {
    // Piece j of the request's k pieces: blocks [j * nb / k, (j + 1) * nb / k), none empty (k <= nb).
    const int r = request_of_slot(split_offsets, batch, p);
    const int64_t k = split_offsets[r + 1] - split_offsets[r], j = p - split_offsets[r];
    const int64_t nb = C[r + 1] - C[r] - kFixedOverheadBlocks;
    info[kPartBeginReq] = r;
    info[kPartBeginBlock] = static_cast<int32_t>(j * nb / k);
    info[kPartEndReq] = r;
    info[kPartEndBlock] = static_cast<int32_t>((j + 1) * nb / k);
    info[kPartBeginSlot] = p;
    return;
  }
  const int64_t w = plan.width;
  const int64_t x0 = static_cast<int64_t>(p) * w;
  int64_t x1 = x0 + w;
  x1 = x1 > total ? total : x1;
  const int r0 = request_of_unit(C, batch, x0);
  const int r1 = request_of_unit(C, batch, x1 - 1);
  info[kPartBeginReq] = r0;
  info[kPartBeginBlock] = block_at_unit(C, r0, x0);
  info[kPartEndReq] = r1;
  info[kPartEndBlock] = block_at_unit(C, r1, x1);
  info[kPartBeginSlot] = split_offsets[r0] + static_cast<int32_t>(p - first_part_of(C, r0, w));
}

// Host reference: the whole plan, sequentially. C must have room for batch + 1 entries.
// The device scheduler (scheduler.cu) produces the identical array.
inline void plan_schedule_host(const int32_t* seq_lens, int batch, int num_parts, int64_t* C, int32_t* schedule) {
  C[0] = 0;
  CostSummary s{INT32_MAX, 0, 0};  // over the non-empty requests
  for (int r = 0; r < batch; ++r) {
    const int c = request_cost(seq_lens[r]);
    C[r + 1] = C[r] + c;
    if (c > 0) {
      s.min_cost = c < s.min_cost ? c : s.min_cost;
      s.max_cost = c > s.max_cost ? c : s.max_cost;
      s.nonempty += 1;
    }
  }
  const PartPlan plan = choose_part_plan(C[batch], num_parts, s, [&](int piece_blocks) {
    int64_t n = 0;
    for (int r = 0; r < batch; ++r) n += pieces_of(num_kv_blocks(seq_lens[r]), piece_blocks);
    return n;
  });
  int32_t* split_offsets = schedule + split_offsets_begin(num_parts);  // (b + 1)
  split_offsets[0] = 0;
  for (int r = 0; r < batch; ++r) split_offsets[r + 1] = split_offsets[r] + num_splits_planned(plan, C[r], C[r + 1]);
  for (int p = 0; p < num_parts; ++p) plan_part(C, split_offsets, batch, plan, p, schedule + static_cast<int64_t>(p) * kPartFields);
  int32_t* combine = schedule + combine_begin(batch, num_parts);  // (kCombineHeader + b)
  int32_t* list = combine + kCombineHeader;                       // (b)
  int num_many = 0, num_listed = 0;
  for (int r = 0; r < batch; ++r) {
    const int n = split_offsets[r + 1] - split_offsets[r];
    num_many += n > kManySplits;
    num_listed += n != 1;
  }
  for (int i = 0; i < batch; ++i) list[i] = -1;
  int many_before = 0, few_before = 0;
  for (int r = 0; r < batch; ++r) {
    const int n = split_offsets[r + 1] - split_offsets[r];
    const int pos = combine_position(n, many_before, few_before, num_many);
    if (pos >= 0) list[pos] = r;
    many_before += n > kManySplits;
    few_before += n != 1 && n <= kManySplits;
  }
  combine[kCombineCount] = num_listed;
  combine[kCombineManyCount] = num_many;
}

}  // namespace jax_mla
