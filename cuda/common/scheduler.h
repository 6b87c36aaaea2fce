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
// Batch-invariant plan (mla_decode(..., batch_invariant=True); ChunkSpec below). Both plans above
// cut a request where the whole batch puts the part boundaries, so its pieces, their merge and
// hence its bits change with the rest of the batch. This plan cuts request r only where its own
// length says: into chunks of Cr = max(C, ceil(nb(r) / S)) blocks, chunk j being blocks
// [j Cr, min((j + 1) Cr, nb)), with C the chunk size (static) and S the most chunks a request may
// have (num_parts; less for a plan made inside the op when the block table is shorter, which a
// valid request never notices: see invariant_max_chunks). Every chunk is one piece with its own
// workspace slot (split_offsets[r] + j) and its own online softmax, however the parts group them,
// and a request of one chunk writes its output directly, so the work per chunk and the merge input
// depend on nothing but the request. The parts then take whole chunks: laying the chunks' costs
// (blocks + kFixedOverheadBlocks each) end to end, part p takes the chunks that start in
// [p W, (p + 1) W), W = ceil(total / num_parts); that only decides where a chunk runs. The merge
// list puts every split request in the few-split class, whose arithmetic (a warp's lanes striding
// over the splits) the SM90 in-kernel merge shares bit for bit, so which merge runs does not
// matter either. A part may hold several chunks of one request; the work iterator
// (work_iterator.h) cuts its range at the chunk boundaries.
//
// Layout of the schedule array (int32, schedule_size(b, num_parts) elements):
//   [0, num_parts * kPartFields)            PartInfo of part p at p * kPartFields
//   [split_offsets_begin, ... + b + 1)      split_offsets: request r's partial results live in
//                                           workspace slots split_offsets[r] .. split_offsets[r+1]-1;
//                                           split_offsets[b] = total number of slots used.
//   [combine_begin, ... + kCombineHeader + b)  the combine's work list (below);
//   batch-invariant plans only: kInvariantFields more, [kInvChunkBlocks] C and [kInvMaxChunks] S,
//   which also make their length differ from a default plan's for every b and num_parts (the
//   API tells the two kinds apart by shape; invariant_schedule_size).
// The combine's work list:
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
  kPartChunkBlocks = 5,  // batch-invariant plan: the chunk size C in blocks; 0 in the default plans
  kPartMaxChunks = 6,    // batch-invariant plan: S, the most chunks per request; 0 otherwise
  kPartFields = 8,       // padded to 32 bytes
};

// The batch-invariant plan's parameters; chunk_blocks == 0: the default plans (line or pieces).
struct ChunkSpec {
  int chunk_blocks;  // C >= 1: a request is cut every C blocks (kBlockN tokens each) ...
  int max_chunks;    // S >= 1: ... into at most S chunks (longer requests get longer chunks)
  MLA_HOST_DEVICE bool invariant() const { return chunk_blocks > 0; }
};

// Trailer of a batch-invariant schedule, after the combine list.
enum InvariantField : int {
  kInvChunkBlocks = 0,
  kInvMaxChunks = 1,
  kInvariantFields = 4,  // not a multiple of kPartFields: no num_parts gives a default plan this length
};

// Chunk size of the batch-invariant plan: 1024 tokens. Its cost is about one fixed overhead
// (kFixedOverheadBlocks) per chunk against the default plans, which cut a request only where the
// batch leaves SMs idle; docs/design.md ("Batch-invariant schedule") has the estimate per benchmark
// configuration behind this value.
inline constexpr int kDefaultInvariantChunkBlocks = 16;
// Largest chunk accepted (tokens = blocks * kBlockN must fit int32).
inline constexpr int kMaxInvariantChunkBlocks = (1 << 30) / kBlockN;

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

// Largest batch the one-CTA device scheduler (scheduler.cu) plans: its prefix sums live in shared
// memory. A GPU call that plans in the op has at most this many requests.
inline constexpr int kMaxScheduleBatch = 16384;

MLA_HOST_DEVICE int64_t split_offsets_begin(int64_t num_parts) { return num_parts * kPartFields; }
MLA_HOST_DEVICE int64_t combine_begin(int64_t batch, int64_t num_parts) {
  return split_offsets_begin(num_parts) + batch + 1;
}
MLA_HOST_DEVICE int64_t schedule_size(int64_t batch, int64_t num_parts) {
  return combine_begin(batch, num_parts) + kCombineHeader + batch;
}
MLA_HOST_DEVICE int64_t invariant_begin(int64_t batch, int64_t num_parts) { return schedule_size(batch, num_parts); }
MLA_HOST_DEVICE int64_t invariant_schedule_size(int64_t batch, int64_t num_parts) {
  return schedule_size(batch, num_parts) + kInvariantFields;
}
MLA_HOST_DEVICE int64_t schedule_size(int64_t batch, int64_t num_parts, bool invariant) {
  return invariant ? invariant_schedule_size(batch, num_parts) : schedule_size(batch, num_parts);
}

// Most workspace slots any schedule over `batch` requests and `num_parts` parts can use:
// each part boundary splits at most one request into one more piece; in the batch-invariant plan
// (max_chunks > 0) every request may have max_chunks chunks.
MLA_HOST_DEVICE int64_t max_splits(int64_t batch, int64_t num_parts, int64_t max_chunks = 0) {
  return max_chunks > 0 ? batch * max_chunks : batch + num_parts;
}

// S of the batch-invariant plan (ChunkSpec::max_chunks): num_parts, since a request never runs on
// more parts than there are, bounded by the chunks a request of the block table's capacity
// (capacity_tokens = max_pages * page_size; < 0 when unknown, as for decode_schedule) can need,
// which keeps the workspace (max_splits) small when the table is. A valid request (seq_len <=
// capacity) gets the same chunks from either value: with nb <= ceil(capacity / kBlockN) blocks,
// ceil(nb / S) <= C whenever S is the capacity's bound, so Cr = C as with S = num_parts (a request
// longer than num_parts * C blocks needs capacity for more than num_parts chunks, so S = num_parts
// there). Only an invalid, longer request (NaN on the GPU, an error on the CPU) is cut differently.
MLA_HOST_DEVICE int invariant_max_chunks(int num_parts, int chunk_blocks, int64_t capacity_tokens) {
  if (capacity_tokens < 0) return num_parts;
  const int64_t capacity_blocks = (capacity_tokens + kBlockN - 1) / kBlockN;
  int64_t s = (capacity_blocks + chunk_blocks - 1) / chunk_blocks;
  s = s < 1 ? 1 : s;
  return s < num_parts ? static_cast<int>(s) : num_parts;
}

MLA_HOST_DEVICE int num_kv_blocks(int seq_len) { return seq_len <= 0 ? 0 : (seq_len + kBlockN - 1) / kBlockN; }

MLA_HOST_DEVICE int request_cost(int seq_len) {
  const int nb = num_kv_blocks(seq_len);
  return nb == 0 ? 0 : nb + kFixedOverheadBlocks;
}

// Batch-invariant plan: the chunk size Cr (blocks) of a request of nb blocks, and its chunk count.
MLA_HOST_DEVICE int request_chunk_blocks(int nb, const ChunkSpec& c) {
  const int spread = nb / c.max_chunks + (nb % c.max_chunks != 0);  // ceil(nb / S), no overflow
  return spread > c.chunk_blocks ? spread : c.chunk_blocks;
}
MLA_HOST_DEVICE int num_chunks(int nb, const ChunkSpec& c) {
  if (nb <= 0) return 0;
  const int cr = request_chunk_blocks(nb, c);
  return nb / cr + (nb % cr != 0);
}
// A request's cost on the batch-invariant plan's line: its blocks plus one overhead per chunk.
MLA_HOST_DEVICE int chunked_request_cost(int seq_len, const ChunkSpec& c) {
  const int nb = num_kv_blocks(seq_len);
  return nb + num_chunks(nb, c) * kFixedOverheadBlocks;
}
// The cost the plan lays on its line for a request.
MLA_HOST_DEVICE int plan_request_cost(int seq_len, const ChunkSpec& c) {
  return c.invariant() ? chunked_request_cost(seq_len, c) : request_cost(seq_len);
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

// Whether a request of num_splits splits is listed in the many-split class: never in the
// batch-invariant plan, whose merges must all share one arithmetic (see the header).
MLA_HOST_DEVICE bool many_split_class(int num_splits, bool invariant) { return !invariant && num_splits > kManySplits; }

// Where request r goes in the combine list (-1: not listed, it has exactly one split).
// many: its class (many_split_class); many_before / few_before: listed requests before r of the
// same class; num_many: the total of the many-split class (listed first).
MLA_HOST_DEVICE int combine_position(int num_splits, bool many, int many_before, int few_before, int num_many) {
  if (num_splits == 1) return -1;
  return many ? many_before : num_many + few_before;
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

// Batch-invariant plan: where the chunks that start at cost unit x or later begin: request r
// (the one holding unit x; x < C[batch]), block min(j Cr, nb) and chunk j (j = nb's chunk count
// when no chunk of r starts at or after x). The chunks of r start at units C[r] + j (Cr + overhead).
struct ChunkPosition {
  int request, block, chunk;
};
MLA_HOST_DEVICE ChunkPosition chunk_at_unit(const int64_t* C, const int32_t* seq_lens, int batch, const ChunkSpec& c,
                                            int64_t x) {
  ChunkPosition pos;
  pos.request = request_of_unit(C, batch, x);
  const int nb = num_kv_blocks(seq_lens[pos.request]);
  const int cr = request_chunk_blocks(nb, c);
  const int64_t step = static_cast<int64_t>(cr) + kFixedOverheadBlocks;
  const int64_t j = (x - C[pos.request] + step - 1) / step;
  const int64_t block = j * cr;
  pos.chunk = static_cast<int>(j);
  pos.block = block < nb ? static_cast<int>(block) : nb;
  return pos;
}

// Batch-invariant plan: part p's PartInfo, the chunks that start in its units [p W, (p + 1) W).
// C is the exclusive prefix sum of plan_request_cost, split_offsets that of num_chunks.
MLA_HOST_DEVICE void plan_part_chunked(const int64_t* C, const int32_t* split_offsets, const int32_t* seq_lens,
                                       int batch, int num_parts, const ChunkSpec& c, int p, int32_t* info) {
  for (int f = 0; f < kPartFields; ++f) info[f] = 0;
  info[kPartChunkBlocks] = c.chunk_blocks;
  info[kPartMaxChunks] = c.max_chunks;
  const int64_t total = C[batch];
  const int64_t w = units_per_part(total, num_parts);
  const int64_t x0 = static_cast<int64_t>(p) * w;
  if (x0 >= total) {
    info[kPartBeginReq] = batch;
    info[kPartEndReq] = batch - 1;
    return;
  }
  const ChunkPosition begin = chunk_at_unit(C, seq_lens, batch, c, x0);
  info[kPartBeginReq] = begin.request;
  info[kPartBeginBlock] = begin.block;
  info[kPartBeginSlot] = split_offsets[begin.request] + begin.chunk;
  const int64_t x1 = x0 + w;
  if (x1 >= total) {  // to the end of the last non-empty request
    const int last = request_of_unit(C, batch, total - 1);
    info[kPartEndReq] = last;
    info[kPartEndBlock] = num_kv_blocks(seq_lens[last]);
  } else {  // up to the next part's first chunk (block 0 of a request: nothing of it)
    const ChunkPosition end = chunk_at_unit(C, seq_lens, batch, c, x1);
    info[kPartEndReq] = end.request;
    info[kPartEndBlock] = end.block;
  }
}

// Host reference: the whole plan, sequentially. C must have room for batch + 1 entries.
// The device scheduler (scheduler.cu) produces the identical array.
// chunks: the batch-invariant plan's parameters (chunks.invariant()), or {0, 0} for the default
// plans; an invariant schedule has invariant_schedule_size(batch, num_parts) elements.
inline void plan_schedule_host(const int32_t* seq_lens, int batch, int num_parts, int64_t* C, int32_t* schedule,
                               ChunkSpec chunks = {0, 0}) {
  const bool invariant = chunks.invariant();
  C[0] = 0;
  CostSummary s{INT32_MAX, 0, 0};  // over the non-empty requests
  for (int r = 0; r < batch; ++r) {
    const int c = plan_request_cost(seq_lens[r], chunks);
    C[r + 1] = C[r] + c;
    if (c > 0) {
      s.min_cost = c < s.min_cost ? c : s.min_cost;
      s.max_cost = c > s.max_cost ? c : s.max_cost;
      s.nonempty += 1;
    }
  }
  PartPlan plan{1, 0};  // the batch-invariant plan has no choice to make
  if (!invariant) {
    plan = choose_part_plan(C[batch], num_parts, s, [&](int piece_blocks) {
      int64_t n = 0;
      for (int r = 0; r < batch; ++r) n += pieces_of(num_kv_blocks(seq_lens[r]), piece_blocks);
      return n;
    });
  }
  int32_t* split_offsets = schedule + split_offsets_begin(num_parts);  // (b + 1)
  split_offsets[0] = 0;
  for (int r = 0; r < batch; ++r) {
    const int n = invariant ? num_chunks(num_kv_blocks(seq_lens[r]), chunks) : num_splits_planned(plan, C[r], C[r + 1]);
    split_offsets[r + 1] = split_offsets[r] + n;
  }
  for (int p = 0; p < num_parts; ++p) {
    int32_t* info = schedule + static_cast<int64_t>(p) * kPartFields;
    if (invariant) {
      plan_part_chunked(C, split_offsets, seq_lens, batch, num_parts, chunks, p, info);
    } else {
      plan_part(C, split_offsets, batch, plan, p, info);
    }
  }
  int32_t* combine = schedule + combine_begin(batch, num_parts);  // (kCombineHeader + b)
  int32_t* list = combine + kCombineHeader;                       // (b)
  int num_many = 0, num_listed = 0;
  for (int r = 0; r < batch; ++r) {
    const int n = split_offsets[r + 1] - split_offsets[r];
    num_many += many_split_class(n, invariant);
    num_listed += n != 1;
  }
  for (int i = 0; i < batch; ++i) list[i] = -1;
  int many_before = 0, few_before = 0;
  for (int r = 0; r < batch; ++r) {
    const int n = split_offsets[r + 1] - split_offsets[r];
    const bool many = many_split_class(n, invariant);
    const int pos = combine_position(n, many, many_before, few_before, num_many);
    if (pos >= 0) list[pos] = r;
    many_before += many;
    few_before += n != 1 && !many;
  }
  combine[kCombineCount] = num_listed;
  combine[kCombineManyCount] = num_many;
  if (invariant) {
    int32_t* trailer = schedule + invariant_begin(batch, num_parts);  // (kInvariantFields)
    for (int f = 0; f < kInvariantFields; ++f) trailer[f] = 0;
    trailer[kInvChunkBlocks] = chunks.chunk_blocks;
    trailer[kInvMaxChunks] = chunks.max_chunks;
  }
}

}  // namespace jax_mla
