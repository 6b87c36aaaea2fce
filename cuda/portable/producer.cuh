// Portable kernel role: the KV loader (the producer of the KV stages). Every thread copies, with cp.async, one 16-byte chunk of
// each of the 9 boxes of a 32-token sub-tile, gathering its token's cache row through the block
// table. It walks the part's pieces of work (work_iterator.h, PieceCursor) in the same order as the
// main loop (mainloop.cuh),
// two sub-tiles ahead of it (one stage computed, one in flight), and reads the block table one
// sub-tile further ahead still, so that the table's latency never sits in front of a copy.
//
// Thread t owns row t / 8 (a token of the sub-tile) and chunk t % 8 of every box row: a warp copies
// 4 whole 128-byte rows per box (coalesced), and a thread needs one block-table entry per sub-tile.
//
// FP8 cache (config.h): the same walk and the same thread -> token mapping; a thread copies chunks
// t % 8, t % 8 + 8, ... of its token's 41-chunk raw row into a raw stage, and dequantize() turns a
// raw stage into the 16-bit stage, each thread writing the 16-byte chunks (of 8 values) that it
// would have copied for a 16-bit cache. Dequantized values are exactly unpack_fp8_kv(row, q's dtype):
// float(e4m3) (exact in fp16, then fp32) times the fp32 tile scale, rounded once to the element
// type; the bf16 RoPE values as they are (bf16) or rounded to fp16. A zero-filled row (a token past
// seq_len or on a bad page) dequantizes to zeros.
//
// Per piece of work the loader also records whether a token < seq_len had no valid page (a page id
// outside [0, num_pages), or a length the request's block-table row cannot hold); the consumer
// turns that into NaN output for the piece. Two flags (piece parity) suffice: the loader runs two
// sub-tiles ahead and every piece spans at least two sub-tiles (config.h), so it never touches the
// piece after next before the consumer has finished the current one.
#pragma once

#include <cstdint>

#include "../common/fp8_convert.cuh"
#include "../common/problem.h"
#include "../common/row_math.cuh"
#include "../common/work_iterator.h"
#include "config.h"
#include "mma.cuh"

namespace jax_mla::portable {

template <typename Element, KvFormat kFormat = KvFormat::kDense>
struct KvLoader {
  static constexpr bool kFp8 = kFormat == KvFormat::kFp8;
  const DecodeProblem* p;
  PartWork work;        // the CTA's part
  int log2_page;        // page_size is a power of two, 1 included (launch.h)
  int row;              // this thread's token within a sub-tile
  uint32_t dst0;        // shared address of (stage 0, box 0, row, swizzled chunk)
  int chunk_elems;      // column offset of this thread's chunk inside a box
  uint32_t raw0;        // FP8: shared address of (raw stage 0, row, chunk t % 8)
  // Cursor: the next sub-tile to load.
  PieceCursor cursor;   // its piece (cursor.request past the part's last request once done)
  int sub, sub_end;     // sub-tiles [sub, sub_end) of the current piece, in kTileKeys-token units
  int seq_len;          // seq_lens of the piece's request
  int page;             // block-table entry for this thread's token of sub-tile `sub` (-1: none)
  uint32_t bad_bits;    // bit (piece & 1): a token of that piece had no valid page

  __device__ __forceinline__ void init(const DecodeProblem& params, const PartWork& part,
                                       Storage<Element, kFormat>& s) {
    p = &params;
    work = part;
    log2_page = 31 - __clz(params.page_size);
    row = threadIdx.x / kChunksPerBoxRow;
    const int chunk = threadIdx.x % kChunksPerBoxRow;
    chunk_elems = chunk * 8;
    dst0 = smem_addr(&s.kv[0][0][row][0]) + ((chunk ^ (row & 7)) << 4);
    if constexpr (kFp8) raw0 = smem_addr(&s.raw[0][row][0]) + (chunk << 4);
    bad_bits = 0;
    cursor.start(work, [&](const PieceOfWork& w) { enter_piece(w); });
    lookup();
  }

  __device__ __forceinline__ bool done() const { return cursor.done(work); }

  // Points the sub-tile cursor at the first sub-tile of piece w (the cursor's new piece).
  __device__ __forceinline__ void enter_piece(const PieceOfWork& w) {
    sub = w.begin_block * kTilesPerBlock;
    sub_end = w.end_block * kTilesPerBlock;
    seq_len = work.seq_len(w);
  }

  // Block-table entry of this thread's token in the cursor's sub-tile. Read only for tokens the
  // request owns (< seq_len) and only inside the request's row of the table.
  __device__ __forceinline__ void lookup() {
    page = -1;
    if (done()) return;
    const int token = sub * kTileKeys + row;
    const int page_index = token >> log2_page;
    if (token < seq_len && page_index < p->max_pages) {
      page = p->block_table[static_cast<int64_t>(cursor.request) * p->max_pages + page_index];
    }
  }

  // Issues the copies of the cursor's sub-tile into `stage`, advances the cursor and looks up the
  // next sub-tile. Always commits one cp.async group (empty past the end of the part), so the
  // consumer's cp_async_wait<1> counts sub-tiles.
  __device__ __forceinline__ void issue(int stage) {
    if (!done()) {
      const int token = sub * kTileKeys + row;
      const bool owned = token < seq_len;
      const bool valid = owned && page >= 0 && page < p->num_pages;
      if (owned && !valid) bad_bits |= 1u << (cursor.ordinal & 1);
      if constexpr (kFp8) {
        // (num_pages * page_size, 656) bytes: chunks chunk_elems / 8 + 8 k of the token's row; the
        // cache base when not valid (not read).
        const uint8_t* base = static_cast<const uint8_t*>(p->kv_cache);
        const uint8_t* src =
            valid ? base + (static_cast<int64_t>(page) * p->page_size + (token & (p->page_size - 1))) * kFp8RowBytes +
                        2 * chunk_elems
                  : base;
        const uint32_t dst = raw0 + stage * (kTileKeys * kFp8RowBytes);
#pragma unroll
        for (int k = 0; k < kFp8CopiesPerThread; ++k) {
          if (chunk_elems / 8 + kChunksPerBoxRow * k < kFp8RowChunks) {
            cp_async_16(dst + 16 * kChunksPerBoxRow * k, valid ? src + 16 * kChunksPerBoxRow * k : src, valid);
          }
        }
      } else {
        const Element* base = static_cast<const Element*>(p->kv_cache);
        // (num_pages * page_size, 576): the token's cache row; the cache base when not valid (not read).
        const Element* src =
            valid ? base + (static_cast<int64_t>(page) * p->page_size + (token & (p->page_size - 1))) * kHeadDimQK +
                        chunk_elems
                  : base;
        const uint32_t dst = dst0 + stage * kStageBytes;
#pragma unroll
        for (int box = 0; box < kBoxes; ++box) {
          cp_async_16(dst + box * kBoxBytes, valid ? src + box * kBoxCols : src, valid);
        }
      }
      if (++sub == sub_end) cursor.next(work, [&](const PieceOfWork& w) { enter_piece(w); });
      lookup();
    }
    cp_async_commit();
  }

  // FP8: raw stage `stage` -> the 16-bit stage (SharedStorageFp8::kv[0]). Thread (row, chunk c)
  // writes columns [64 b + 8 c, +8) of its token for every box b, at the swizzled place the 16-bit
  // loader would copy them to. The caller's barriers make the raw stage complete before and the
  // 16-bit stage visible after.
  __device__ __forceinline__ void dequantize(int stage, SharedStorageFp8<Element>& s) const {
    static_assert(kFp8, "dequantize() is the FP8 loader's");
    const uint8_t* raw = &s.raw[stage][row][0];
#pragma unroll
    for (int box = 0; box < kBoxesV; ++box) {
      const int col = box * kBoxCols + chunk_elems;
      const float scale = *reinterpret_cast<const float*>(raw + kFp8ScalesOffset + 4 * (col / kFp8TileCols));
      const uint2 e4m3 = *reinterpret_cast<const uint2*>(raw + col);  // 8 values, 8-byte aligned
      *reinterpret_cast<uint4*>(&s.kv[0][box][row][0] + ((chunk_elems / 8) ^ (row & 7)) * 8) =
          dequantize_e4m3x8<Element>(e4m3, scale);
    }
    // The RoPE box: 8 bf16 values at bytes kFp8RopeOffset + 16 c, kept (bf16) or rounded (fp16).
    const uint4 rope = rope_bf16x8_to<Element>(*reinterpret_cast<const uint4*>(raw + kFp8RopeOffset + 2 * chunk_elems));
    *reinterpret_cast<uint4*>(&s.kv[0][kBoxesV][row][0] + ((chunk_elems / 8) ^ (row & 7)) * 8) = rope;
  }

  // The bad flag of piece `k` (this thread's tokens), cleared for piece k + 2.
  __device__ __forceinline__ bool take_bad(int k) {
    const uint32_t bit = 1u << (k & 1);
    const bool bad = (bad_bits & bit) != 0;
    bad_bits &= ~bit;
    return bad;
  }
};

}  // namespace jax_mla::portable
