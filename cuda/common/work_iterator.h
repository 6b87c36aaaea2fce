// The work of one part of the split-KV schedule (scheduler.h), as every kernel walks it: the part's
// pieces of work, in request order, each the KV blocks [begin_block, end_block) of one request.
// Every role of every kernel (the producers, MMA, softmax, correction and epilogue roles of the
// GPU kernels; the CPU kernel's tasks) walks its part through this header, so all of them agree on
// which pieces exist, in which order, and at which workspace slot each split piece's partial lives:
// the roles of one CTA never exchange piece boundaries, they count pieces (and tiles) the same way.
//
// A part lists requests info[kPartBeginReq] .. info[kPartEndReq] (none when end < begin). Its
// first and last request may be cut by a part boundary; the requests between lie wholly inside it.
// A request of the range may still yield no piece: an empty request (seq_len <= 0), a part that
// holds only the overhead units of its first request (scheduler.h's cost line), or a
// batch-invariant part whose range of its first or last request holds no chunk. The walks skip
// those, so piece ordinals (and their parity, which selects double-buffered per-piece state such as
// the SM90 row sums or the portable loader's bad-page flags) count non-empty pieces only.
//
// In the batch-invariant plan a part may hold several chunks of one request (scheduler.h): each
// is its own piece (own slot, own online softmax), so the walks cut the part's range of a request
// at its chunk boundaries. Pieces of the same request then follow each other; nothing here assumes
// that consecutive pieces belong to different requests.
//
// Host and device: the CPU kernel compiles it as plain C++ (MLA_HOST_DEVICE, config.h).
#pragma once

#include <cstdint>

#include "config.h"
#include "scheduler.h"

namespace jax_mla {

// One piece of work: the blocks of one request that one part processes.
struct PieceOfWork {
  int request;
  int begin_block, end_block;  // [begin, end) in kBlockN-token blocks; empty when begin >= end
  int slot;                    // workspace slot of the piece's partial when num_splits > 1
  int num_splits;              // pieces the request was cut into (>= 1 for a non-empty piece)
  MLA_HOST_DEVICE bool empty() const { return begin_block >= end_block; }
};

// The pieces of one part of a schedule.
struct PartWork {
  const int32_t* info;           // (kPartFields) the part's entry of the schedule
  const int32_t* split_offsets;  // (b + 1) request r's slots: split_offsets[r] .. split_offsets[r + 1] - 1
  const int32_t* seq_lens;       // (b)

  PartWork() = default;
  // Part `part` of `schedule` (schedule_size(b, num_parts) int32, scheduler.h).
  MLA_HOST_DEVICE PartWork(const int32_t* schedule, int num_parts, int part, const int32_t* lens)
      : info(schedule + static_cast<int64_t>(part) * kPartFields),
        split_offsets(schedule + static_cast<int64_t>(num_parts) * kPartFields),
        seq_lens(lens) {}

  MLA_HOST_DEVICE int first_request() const { return info[kPartBeginReq]; }
  MLA_HOST_DEVICE int last_request() const { return info[kPartEndReq]; }  // < first_request(): no work

  // Whether the part belongs to a batch-invariant plan, whose requests are cut into chunks.
  MLA_HOST_DEVICE bool chunked() const { return info[kPartChunkBlocks] > 0; }

  // The span of request r (first_request() <= r <= last_request()) in this part: all of its
  // blocks the part holds, at the slot of the first; may be empty. Only the part's first request
  // can start past block 0 or at a slot other than its first one. In the default plans the span is
  // the request's one piece in the part; take_piece() cuts it into pieces in every plan.
  MLA_HOST_DEVICE PieceOfWork piece(int r) const {
    PieceOfWork w;
    w.request = r;
    w.begin_block = r == info[kPartBeginReq] ? info[kPartBeginBlock] : 0;
    w.end_block = r == info[kPartEndReq] ? info[kPartEndBlock] : num_kv_blocks(seq_lens[r]);
    w.slot = r == info[kPartBeginReq] ? info[kPartBeginSlot] : split_offsets[r];
    w.num_splits = split_offsets[r + 1] - split_offsets[r];
    return w;
  }

  // seq_lens of the piece's request. Roles read it through here rather than from the problem, so
  // that the compiler sees the same load as piece()'s and keeps one.
  MLA_HOST_DEVICE int seq_len(const PieceOfWork& w) const { return seq_lens[w.request]; }

  // Blocks per piece when cutting the non-empty span w: the request's chunk size in the
  // batch-invariant plan, else the whole span. A span starts on a chunk boundary (the plan puts
  // part boundaries only there), so cutting every `step` blocks from its start gives the chunks.
  MLA_HOST_DEVICE int piece_step(const PieceOfWork& w) const {
    if (!chunked()) return w.end_block - w.begin_block;
    const ChunkSpec c{info[kPartChunkBlocks], info[kPartMaxChunks] > 0 ? info[kPartMaxChunks] : 1};
    return request_chunk_blocks(num_kv_blocks(seq_lens[w.request]), c);
  }

  // Cuts the next piece off the front of the non-empty span w (piece_step(w) blocks at most) and
  // leaves the rest in w (empty when none is left); the pieces of one span take consecutive slots.
  MLA_HOST_DEVICE static PieceOfWork take_piece(PieceOfWork& w, int step) {
    PieceOfWork piece = w;
    if (w.end_block - w.begin_block > step) piece.end_block = w.begin_block + step;
    w.begin_block = piece.end_block;
    w.slot += 1;
    return piece;
  }

  // Calls f(piece, ordinal) for each non-empty piece, in order; ordinal = 0, 1, ... counts them.
  template <class F>
  MLA_HOST_DEVICE void for_each_piece(F&& f) const {
    int ordinal = 0;
    for (int r = first_request(); r <= last_request(); ++r) {
      PieceOfWork span = piece(r);
      if (span.empty()) continue;
      const int step = piece_step(span);
      do {
        f(take_piece(span, step), ordinal);
        ++ordinal;
      } while (!span.empty());
    }
  }
};

// The same walk as PartWork::for_each_piece, one piece per call, for a role that advances at its
// own pace (the portable kernel's loader, which runs ahead of the computation):
//   cursor.start(work, enter);  ... cursor.next(work, enter);  ... until cursor.done(work).
// enter(piece) runs for each non-empty piece the cursor moves to (the caller keeps what it needs).
struct PieceCursor {
  int request;       // the current piece's request; past work.last_request() once done
  int ordinal;       // the current piece's position among the part's non-empty pieces
  PieceOfWork rest;  // what remains of the request's span after the current piece
  int step;          // its piece_step

  MLA_HOST_DEVICE bool done(const PartWork& work) const { return request > work.last_request(); }

  // Moves to the first non-empty piece of the part.
  template <class Enter>
  MLA_HOST_DEVICE void start(const PartWork& work, Enter&& enter) {
    ordinal = -1;
    request = work.first_request() - 1;
    rest.begin_block = rest.end_block = 0;
    next(work, enter);
  }

  // Moves to the next non-empty piece (past the last request when there is none).
  template <class Enter>
  MLA_HOST_DEVICE void next(const PartWork& work, Enter&& enter) {
    if (!rest.empty()) {  // the next chunk of the same span
      ++ordinal;
      enter(PartWork::take_piece(rest, step));
      return;
    }
    for (++request; request <= work.last_request(); ++request) {
      rest = work.piece(request);
      if (!rest.empty()) {
        step = work.piece_step(rest);
        ++ordinal;
        enter(PartWork::take_piece(rest, step));
        return;
      }
    }
  }
};

}  // namespace jax_mla
