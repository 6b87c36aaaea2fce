// The KV producer: streams paged KV tiles by TMA into a ring of shared-memory stages guarded by
// mbarriers. Shared by the SM90 (wgmma) and SM100 (tcgen05) decode kernels: both consume the same
// tile format, (BLK_N = 64 tokens, 576) stored as 9 boxes of (64 tokens, 64 columns), each box
// rows of 128 bytes with the 128-byte swizzle that wgmma and tcgen05 descriptors read directly.
//
// Protocol (one producer thread, kNumConsumers consumer arrivals per stage):
//   producer: locate_tile(...) resolves the tile's cache rows from the block table (before acquire,
//                             so the table's latency overlaps the wait for a free stage);
//             acquire(state)  waits until every consumer released the stage (the producer starts
//                             at phase 1, so the first pass over the ring does not wait);
//             load_tile(...)  one expect_tx arrival per box, then the TMA copies; the copies'
//                             byte count completes the box's "full" barrier;
//             commit_step()   advances the ring position (stage, phase).
//   consumer: wait_box(state, box) before reading a box; release(state) once its MMAs that read
//             the stage have completed; then advance its own copy of the state.
// Every box has its own full barrier so that QK^T can start on box 0 while later boxes are in flight.
// Every wait goes through a wait policy (watchdog.cuh): NoWatchdog in production, Watchdog in the
// self-check's instantiations, whose fault hook (withheld_box) also lives here.
//
// Two rings share the tile lookup and the box copies:
//   stage ring (DecodeKVProducer, KVPipelineBarriers, KVConsumer): kNumStages stages of 9 boxes, a
//     stage goes back to the producer as a whole (one empty barrier per stage). SM100 (one
//     tcgen05.commit frees a stage) and benchmarks/tma_bandwidth.cu.
//   box ring (BoxRingProducer, BoxRingBarriers, BoxRingConsumer): kNumSlots slots of one box each,
//     a whole number of tiles (kNumSlots % 9 == 0), so tile g's box b sits in slot
//     (9 g + b) mod kNumSlots and the tiles never wrap. It runs as the stage ring does: one empty
//     barrier per tile position (that of its box 0) with one arrival per consumer, one wait per
//     tile; but every box has its own slot and full barrier, which lets a tile's boxes load as
//     grouped copies (kBoxesPerGroup). SM90.
#pragma once

#include <cstdint>

#include "config.h"
#include "problem.h"
#include "ptx.cuh"
#include "watchdog.cuh"
#include "work_iterator.h"

namespace jax_mla {

inline constexpr int kKvBoxCols = 64;                          // 128 bytes of 16-bit elements
inline constexpr int kKvBoxesQK = kHeadDimQK / kKvBoxCols;     // 9: whole row, for Q K^T
inline constexpr int kKvBoxesV = kHeadDimV / kKvBoxCols;       // 8: the V part, for P V
inline constexpr int kKvRopeBox = kKvBoxesV;                   // box holding the 64 RoPE columns
inline constexpr int kKvBoxElems = kBlockN * kKvBoxCols;       // (BLK_N, 64)
inline constexpr int kKvBoxBytes = kKvBoxElems * 2;            // 8 KB
inline constexpr int kKvTileBytes = kKvBoxesQK * kKvBoxBytes;  // 72 KB per stage
static_assert(kHeadDimQK % kKvBoxCols == 0 && kHeadDimV % kKvBoxCols == 0);
static_assert(kKvBoxBytes % 1024 == 0, "boxes must keep the 1024-byte alignment of the 128B swizzle");

// Position in the ring: which stage, and the parity of that stage's current fill.
template <int kNumStages>
struct PipelineState {
  int stage = 0;
  uint32_t phase = 0;
  __device__ __forceinline__ void advance() {
    if (++stage == kNumStages) {
      stage = 0;
      phase ^= 1;
    }
  }
  __device__ __forceinline__ PipelineState next() const {
    PipelineState s = *this;
    s.advance();
    return s;
  }
};

// The barriers of the ring; lives in shared memory.
template <int kNumStages>
struct KVPipelineBarriers {
  uint64_t full[kNumStages][kKvBoxesQK];  // producer -> consumers, one per box, completed by TMA bytes
  uint64_t empty[kNumStages];             // consumers -> producer, kNumConsumers arrivals

  // Called by one thread before any use; the caller fences and syncs afterwards. full_arrivals:
  // arrivals that complete a box besides its TMA bytes (1: the producer's expect_tx; SM100's FP8
  // path: one per dequantizing warp, as BoxRingBarriers::init).
  __device__ __forceinline__ void init(int num_consumers, int full_arrivals = 1) {
    for (int s = 0; s < kNumStages; ++s) {
      for (int b = 0; b < kKvBoxesQK; ++b) ptx::mbarrier_init(&full[s][b], full_arrivals);
      ptx::mbarrier_init(&empty[s], num_consumers);
    }
  }
};

// Where the tokens of one KV tile come from: the paged cache through the request's block-table row.
struct PagedKV {
  const CUtensorMap* map;     // rows = num_pages * page_size tokens, cols = 576; box (64 cols, box_rows)
  const int32_t* page_table;  // (max_pages) this request's block-table row
  int seq_len;
  int page_size;       // power of two in [16, 256]
  int log2_page_size;
  int num_pages;       // pages in the cache
  int max_pages;       // columns of the block table
  int oob_row;         // a row past the end of the cache: TMA fills it with zeros
};

// Where the 64 tokens starting at `first_token` come from: one cache row per TMA copy (a copy is
// min(page_size, 64) tokens of one page). Tokens past seq_len in a page the request does not own
// are read from a row past the end of the cache, which TMA fills with zeros; tokens past seq_len
// inside its last page are loaded as they are (the consumer masks their scores and zeroes their V
// rows, so whatever they hold cannot reach the output). Reads the block table only, so the
// producer calls it before waiting for a free stage and the table's latency overlaps the wait.
// `ok` is false when the table points outside the cache or is too short for seq_len.
struct TileSource {
  int rows[kBlockN / kMinGpuPageSize];
  int copies;    // 1, 2 or 4
  int box_rows;  // tokens per copy
  bool ok;
};

__device__ __forceinline__ TileSource locate_tile(const PagedKV& kv, int first_token) {
  TileSource t;
  t.box_rows = kv.page_size < kBlockN ? kv.page_size : kBlockN;
  t.copies = kBlockN / t.box_rows;
  t.ok = true;
#pragma unroll
  for (int k = 0; k < kBlockN / kMinGpuPageSize; ++k) {
    t.rows[k] = kv.oob_row;
    const int token = first_token + k * t.box_rows;
    if (k < t.copies && token < kv.seq_len) {
      const int page_index = token >> kv.log2_page_size;
      if (page_index >= kv.max_pages) {
        t.ok = false;
      } else {
        const int page = kv.page_table[page_index];
        if (page < 0 || page >= kv.num_pages) {
          t.ok = false;
        } else {
          t.rows[k] = page * kv.page_size + (token & (kv.page_size - 1));
        }
      }
    }
  }
  return t;
}

// The TMA copies of box `box` (columns 64 box .. 64 box + 63) of a located tile into box_dst, (BLK_N, 64),
// completing on `bar` (whose expected bytes the caller armed): one copy per page chunk.
template <typename Element>
__device__ __forceinline__ void copy_box(Element* box_dst, const PagedKV& kv, uint64_t* bar, int box,
                                         const TileSource& t) {
#pragma unroll
  for (int k = 0; k < kBlockN / kMinGpuPageSize; ++k) {
    if (k < t.copies) ptx::tma_load_2d(box_dst + k * t.box_rows * kKvBoxCols, kv.map, bar, box * kKvBoxCols, t.rows[k]);
  }
}

template <typename Element, int kNumStages>
struct DecodeKVProducer {
  static constexpr int kRingTiles = kNumStages;
  static constexpr bool kWarpWide = false;  // produce_part runs on one thread
  KVPipelineBarriers<kNumStages>* bars;
  Element* smem;  // (stage, box, BLK_N, 64)
  PipelineState<kNumStages> state;

  __device__ __forceinline__ Element* stage_ptr(int stage) const {
    return smem + static_cast<size_t>(stage) * kKvBoxesQK * kKvBoxElems;
  }

  template <typename W = NoWatchdog>
  __device__ __forceinline__ void acquire(const W& wd = W{}) {
    wd.wait(&bars->empty[state.stage], state.phase ^ 1);
  }

  __device__ __forceinline__ void commit_step() { state.advance(); }

  __device__ __forceinline__ TileSource locate_tile(const PagedKV& kv, int first_token) const {
    return jax_mla::locate_tile(kv, first_token);
  }

  // Issues the TMA copies of a located tile into the current stage (after acquire()). withheld_box:
  // a box whose arrival and copy are left out (the self-check's fault injection), -1 for none.
  __device__ __forceinline__ void load_tile(const PagedKV& kv, const TileSource& t, int withheld_box = -1) {
    Element* dst = stage_ptr(state.stage);
#pragma unroll 1
    for (int box = 0; box < kKvBoxesQK; ++box) {
      if (box == withheld_box) continue;
      uint64_t* bar = &bars->full[state.stage][box];
      ptx::mbarrier_arrive_expect_tx(bar, kKvBoxBytes);
      copy_box(dst + box * kKvBoxElems, kv, bar, box, t);
    }
  }

  // The slot of the tile being produced, for the producer's hooks.
  __device__ __forceinline__ int tile_stage() const { return state.stage; }
};

// Tiles of a piece the producer issues before it waits for the consumers to release the previous
// piece's Q (below). Loading them cannot deadlock as long as they fit in the ring: the position of
// the piece's tile j < kRingTiles was last used by a tile of an earlier piece, whose release never
// waits for this piece's Q. One, not the whole ring: the second position frees up only after the
// previous piece's last P V, later than its Q is released (SM100: after its last S; SM90: after
// both consumers' last P V, about when that position frees), and this piece's first S needs Q.
inline constexpr int kPieceLookaheadTiles = 1;

// The producer thread's whole job, shared by the SM90 and SM100 kernels and by both rings: walk the
// pieces of one split-KV part (work_iterator.h) and, per piece, issue its first KV tile (or
// kPieceLookaheadTiles), then load Q of this CTA's row block once the consumers released the
// previous piece's Q (q_empty, parity of the piece count), then the piece's other tiles. So the ring
// does not drain at a piece boundary: the next piece's first tile loads while the consumers finish
// the previous piece. Q of a row block is stored as 9 boxes of (BLK_M, 64). Hooks keep each
// kernel's own bookkeeping (bad block-table entries):
//   on_piece(ordinal)  before any tile of the piece (the producer may be up to two pieces ahead of
//                      the consumers' epilogue then: tests/cpu/test_sm90_ring_protocol.py);
//   on_tile(ordinal, stage, ok)  after acquire() (the stage, or the slot of box 0, is free), before
//                      the tile's arrivals, so a consumer that has waited for the tile also sees what
//                      the hook wrote.
// wd: the wait policy (watchdog.cuh) of every wait here, and its fault hook.
// Producer::kWarpWide: the whole warp runs this (a producer whose tile loads take every lane, such as
// a gather of one-token pages): every lane waits and loads its share, lane 0 alone loads Q and runs
// the hooks, and the warp syncs after the hook so that its write precedes every lane's arrival.
template <typename Producer, typename Element, typename OnPiece, typename OnTile, typename W = NoWatchdog>
__device__ __forceinline__ void produce_part(Producer& producer, const DecodeProblem& p, const CUtensorMap* q_map,
                                             const CUtensorMap* kv_map, const PartWork& work, int m_block,
                                             Element* q_smem,  // (9 boxes, BLK_M, 64)
                                             uint64_t* q_full, uint64_t* q_empty, OnPiece on_piece,
                                             OnTile on_tile, const W& wd = W{}) {
  static_assert(kPieceLookaheadTiles >= 0 && kPieceLookaheadTiles <= Producer::kRingTiles,
                "tiles issued before the previous piece's Q is released must fit in the ring (deadlock)");
  constexpr int kQBoxElems = kBlockM * kKvBoxCols;
  const int log2_page = 31 - __clz(p.page_size);
  const bool leader = !Producer::kWarpWide || threadIdx.x % 32 == 0;
  int tile = 0;  // the CTA's tiles so far (the fault hook's index)
  work.for_each_piece([&](const PieceOfWork& w, int ordinal) {
    const int r = w.request;
    const PagedKV kv{kv_map,
                     p.block_table + static_cast<int64_t>(r) * p.max_pages,
                     work.seq_len(w),
                     p.page_size,
                     log2_page,
                     p.num_pages,
                     p.max_pages,
                     p.num_pages * p.page_size};
    if (leader) on_piece(ordinal);
    // One loop (one copy of the tile code): Q goes in before the tile after the lookahead ones.
    const int q_before = min(w.end_block, w.begin_block + kPieceLookaheadTiles);
#pragma unroll 1
    for (int blk = w.begin_block;; ++blk) {
      // live(): always true in production. Past a watchdog's deadline the producer arrives on no
      // transaction barrier any more: a release the consumers gave without waiting may leave that
      // barrier's previous copy in flight, and a second expect_tx arrival on an incomplete phase
      // would underflow its pending count. (A release backed by a real completion keeps it live.)
      if (blk == q_before) {
        wd.wait(q_empty, (ordinal & 1) ^ 1);
        if (leader && wd.live()) {
          ptx::mbarrier_arrive_expect_tx(q_full, kKvBoxesQK * kQBoxElems * 2);
          const int q_row = r * p.rows + m_block * kBlockM;
#pragma unroll 1
          for (int box = 0; box < kKvBoxesQK; ++box) {
            ptx::tma_load_2d(q_smem + box * kQBoxElems, q_map, q_full, box * kKvBoxCols, q_row);
          }
        }
      }
      if (blk == w.end_block) break;
      const auto source = producer.locate_tile(kv, blk * kBlockN);  // block-table reads overlap the wait
      producer.acquire(wd);
      if (leader) on_tile(ordinal, producer.tile_stage(), source.ok);
      if constexpr (Producer::kWarpWide) __syncwarp();
      if (wd.live()) producer.load_tile(kv, source, wd.withheld_box(tile));
      producer.commit_step();
      ++tile;
    }
  });
}

// Consumer side of the same ring; W: the wait policy (watchdog.cuh).
template <int kNumStages, typename W = NoWatchdog>
struct KVConsumer {
  KVPipelineBarriers<kNumStages>* bars;
  W wd{};

  __device__ __forceinline__ void wait_box(const PipelineState<kNumStages>& s, int box) const {
    wd.wait(&bars->full[s.stage][box], s.phase);
  }
  // One arrival per consumer (an elected thread, after its MMAs reading the stage completed).
  __device__ __forceinline__ void release(const PipelineState<kNumStages>& s) const { release_stage(s.stage); }
  __device__ __forceinline__ void release_stage(int stage) const { ptx::mbarrier_arrive(&bars->empty[stage]); }
};

// ---------------------------------------------------------------------------------------------
// The box ring (see the top of this file).

// Grouped copies (pages of >= 64 tokens): a tile's 9 boxes come as
// 3 copies of 3 boxes each through the cache's column-box view (tensor_map.h
// make_tensor_map_col_boxes), each completing the barrier of its first box's slot; consumers then
// wait on that barrier for each of the 3 boxes. benchmarks/tma_bandwidth.cu (copy mode, H100,
// 2026-12-05): with the decode kernel's hold of a stage, 3 copies per tile land a tile every
// 2043 ns per SM against 2204 ns for 9 copies. (kBoxesPerGroup is in config.h: the host builds
// the tensor map.)
static_assert(kKvBoxesQK % kBoxesPerGroup == 0);

// The barriers of a box ring; lives in shared memory.
template <int kNumSlots>
struct BoxRingBarriers {
  static_assert(kNumSlots % kKvBoxesQK == 0, "a box ring holds whole tiles");
  uint64_t full[kNumSlots];   // producer -> consumers: completed by the TMA bytes of the box in the slot
  // consumers -> producer: only the barrier of each tile's box 0 slot is used, one arrival per
  // consumer.
  uint64_t empty[kNumSlots];

  // Called by one thread before any use; the caller fences and syncs afterwards. full_arrivals:
  // arrivals that complete a box besides its TMA bytes (1: the producer's expect_tx; SM90's FP8
  // path: one per dequantizing warp).
  __device__ __forceinline__ void init(int num_consumers, int full_arrivals = 1) {
    for (int s = 0; s < kNumSlots; ++s) {
      ptx::mbarrier_init(&full[s], full_arrivals);
      ptx::mbarrier_init(&empty[s], num_consumers);
    }
  }
};

// Where one tile's 9 boxes sit in a box ring: box b in slot first + b (whole tiles: no wrap). Every
// thread of the CTA walks the same tile sequence, so every copy of this position agrees.
template <int kNumSlots>
struct TileSlots {
  static_assert(kNumSlots % kKvBoxesQK == 0, "a box ring holds whole tiles");
  int first = 0;       // slot of box 0
  uint32_t phase = 0;  // parity of the current fill of the tile's slots
  __device__ __forceinline__ int slot(int box) const { return first + box; }
  __device__ __forceinline__ uint32_t phase_of(int) const { return phase; }
  __device__ __forceinline__ void advance() {
    first += kKvBoxesQK;
    if (first >= kNumSlots) {
      first -= kNumSlots;
      phase ^= 1u;
    }
  }
  __device__ __forceinline__ TileSlots next() const {
    TileSlots t = *this;
    t.advance();
    return t;
  }
};

// Producer side of a box ring: the same tile lookup and box copies as DecodeKVProducer; a tile waits
// for its position once (acquire), then its boxes load one by one or as grouped copies.
template <typename Element, int kNumSlots>
struct BoxRingProducer {
  static constexpr int kRingTiles = kNumSlots / kKvBoxesQK;
  static constexpr bool kWarpWide = false;  // produce_part runs on one thread
  BoxRingBarriers<kNumSlots>* bars;
  Element* smem;  // (slot, BLK_N, 64)
  TileSlots<kNumSlots> tile;
  // Grouped copies (see kBoxesPerGroup) when set: the column-box view of the cache, box
  // (64, 64, kBoxesPerGroup). Only for pages of >= 64 tokens; the consumers must be told
  // (BoxRingConsumer::grouped).
  const CUtensorMap* group_map = nullptr;

  __device__ __forceinline__ TileSource locate_tile(const PagedKV& kv, int first_token) const {
    return jax_mla::locate_tile(kv, first_token);
  }
  // Waits until the tile's position may be overwritten (the producer starts at phase 1, so the
  // first pass over the ring does not wait). produce_part's hook runs after this, before any
  // arrival of the tile.
  template <typename W = NoWatchdog>
  __device__ __forceinline__ void acquire(const W& wd = W{}) const {
    wd.wait(&bars->empty[tile.slot(0)], tile.phase_of(0) ^ 1u);
  }
  // Issues the tile's copies (after acquire()); withheld_box as DecodeKVProducer::load_tile's (a
  // group's first box leaves out the group).
  __device__ __forceinline__ void load_tile(const PagedKV& kv, const TileSource& t, int withheld_box = -1) {
    if (group_map != nullptr) {
      // One cache row per tile (pages of >= 64 tokens); the slots of a tile are consecutive.
#pragma unroll 1
      for (int box = 0; box < kKvBoxesQK; box += kBoxesPerGroup) {
        if (box == withheld_box) continue;
        const int slot = tile.slot(box);
        uint64_t* bar = &bars->full[slot];
        ptx::mbarrier_arrive_expect_tx(bar, kBoxesPerGroup * kKvBoxBytes);
        ptx::tma_load_3d(smem + static_cast<size_t>(slot) * kKvBoxElems, group_map, bar, 0, t.rows[0], box);
      }
      return;
    }
    // Pages of < 64 tokens: box by box, each box one copy per page chunk.
#pragma unroll 1
    for (int box = 0; box < kKvBoxesQK; ++box) {
      if (box == withheld_box) continue;
      const int slot = tile.slot(box);
      uint64_t* bar = &bars->full[slot];
      ptx::mbarrier_arrive_expect_tx(bar, kKvBoxBytes);
      copy_box(smem + static_cast<size_t>(slot) * kKvBoxElems, kv, bar, box, t);
    }
  }
  __device__ __forceinline__ void commit_step() { tile.advance(); }
  __device__ __forceinline__ int tile_stage() const { return tile.first; }
};

// Consumer side of a box ring; W: the wait policy (watchdog.cuh).
template <int kNumSlots, typename W = NoWatchdog>
struct BoxRingConsumer {
  BoxRingBarriers<kNumSlots>* bars;
  bool grouped = false;  // the producer loads grouped copies (its group_map is set)
  W wd{};

  __device__ __forceinline__ void wait_box(const TileSlots<kNumSlots>& t, int box) const {
    // Grouped copies complete the barrier of the group's first box.
    const int leader = grouped ? box - box % kBoxesPerGroup : box;
    wd.wait(&bars->full[t.slot(leader)], t.phase_of(leader));
  }
  // This consumer is done with tile t (one arrival per consumer), after its MMAs reading it completed.
  __device__ __forceinline__ void release_tile(const TileSlots<kNumSlots>& t) const {
    ptx::mbarrier_arrive(&bars->empty[t.first]);
  }
};

}  // namespace jax_mla
