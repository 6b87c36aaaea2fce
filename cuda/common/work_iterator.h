// The work of one part of the split-KV schedule (scheduler.h), as every kernel walks it: the part's
// pieces of work, in request order, each the KV blocks [begin_block, end_block) of one request.
// Every role of every kernel (the producers, MMA, softmax, correction and epilogue roles of the
// GPU kernels; the CPU kernel's tasks) walks its part through this header, so all of them agree on
// which pieces exist, in which order, and at which workspace slot each split piece's partial lives:
// the roles of one CTA never exchange piece boundaries, they count pieces (and tiles) the same way.
//
// A part lists requests info[kPartBeginReq] .. info[kPartEndReq] (none when end < begin). Its
// first and last request may be cut by a part boundary; the requests between lie wholly inside it.
// A request of the range may still yield no piece: an empty request (seq_len <= 0), or a part that
// holds only the overhead units of its first request (scheduler.h's cost line). The walks skip
// those, so piece ordinals (and their parity, which selects double-buffered per-piece state such as
// the SM90 row sums or the portable loader's bad-page flags) count non-empty pieces only.
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

  // The piece of request r (first_request() <= r <= last_request()) in this part; may be empty.
  // Only the part's first request can start past block 0 or at a slot other than its first one.
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

  // Calls f(piece, ordinal) for each non-empty piece, in order; ordinal = 0, 1, ... counts them.
  template <class F>
  MLA_HOST_DEVICE void for_each_piece(F&& f) const {
    int ordinal = 0;
    for (int r = first_request(); r <= last_request(); ++r) {
      const PieceOfWork w = piece(r);
      if (w.empty()) continue;
      f(w, ordinal);
      ++ordinal;
    }
  }
};

// The same walk as PartWork::for_each_piece, one piece per call, for a role that advances at its
// own pace (the portable kernel's loader, which runs ahead of the computation):
//   cursor.start(work, enter);  ... cursor.next(work, enter);  ... until cursor.done(work).
// enter(piece) runs for each non-empty piece the cursor moves to (the caller keeps what it needs).
struct PieceCursor {
  int request;  // the current piece's request; past work.last_request() once done
  int ordinal;  // the current piece's position among the part's non-empty pieces

  MLA_HOST_DEVICE bool done(const PartWork& work) const { return request > work.last_request(); }

  // Moves to the first non-empty piece of the part.
  template <class Enter>
  MLA_HOST_DEVICE void start(const PartWork& work, Enter&& enter) {
    ordinal = -1;
    request = work.first_request() - 1;
    next(work, enter);
  }

  // Moves to the next non-empty piece (past the last request when there is none).
  template <class Enter>
  MLA_HOST_DEVICE void next(const PartWork& work, Enter&& enter) {
    for (++request; request <= work.last_request(); ++request) {
      const PieceOfWork w = work.piece(request);
      if (!w.empty()) {
        ++ordinal;
        enter(w);
        return;
      }
    }
  }
};

}  // namespace jax_mla
