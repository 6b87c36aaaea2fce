// Compile-time configuration of the portable decode kernel (SM80 and later: A100, A10/RTX 30xx,
// L4/L40/RTX 40xx, H100/H200 when forced, RTX 50xx / SM120, and any later GPU through PTX) and its
// shared-memory plan. It uses only instructions every architecture since SM80 has: mma.sync
// m16n8k16 (bf16 / fp16 in, fp32 accumulate), ldmatrix and 16-byte cp.async.
//
// Why 32 query rows per CTA (not the 64 of kBlockM): the budget has to fit the smallest SM80+
// shared memory, 99 KB per block (SM86, SM89, SM120), and the 255-register limit.
//   - O for 64 rows x 512 fp32 is 128 KB, half of the 256 KB register file; Q for 64 rows is 72 KB
//     more, and Q in shared memory (72 KB) leaves no room for one 72 KB KV tile. With 32 rows, O is
//     64 KB (64 registers per thread over 8 warps) and Q (36 KB) fits in registers, spread over the
//     4 warps of a row group by K (each holds 9 of the 36 k-steps: 36 registers).
//   - Keys go in sub-tiles of 32 tokens (half a scheduling block): a sub-tile is 32 x 576 x 2 B =
//     36 KB, so two stages (one computed, one in flight) take 72 KB.
//
// CTA = 8 warps (256 threads): warp w = (row group rg = w / 4, quarter wq = w % 4).
//   Q K^T:  warp (rg, wq) computes the partial scores of rows [16 rg, 16 rg + 16) over all 32 keys
//           of the sub-tile and its k-steps {4 b + wq : b = 0..8} (one 16-column step of each of the
//           9 column boxes), 36 mma; the 4 partials of a row group are summed through shared memory
//           in a fixed order (deterministic, and every warp of the group ends with the same scores).
//   softmax: every warp of the row group computes the same fp32 online softmax of its 16 rows, so P
//           never leaves registers (the score fragment is the A operand of P V) and the row sums need
//           no exchange.
//   P V:    warp (rg, wq) accumulates O[16 rows, 128 columns wq] (boxes 2 wq, 2 wq + 1), 32 mma.
//
// Registers per thread (budget 255 at 256 threads, 1 CTA per SM): O 64 + Q 36 + scores 16 + P 8 +
// operand fragments 4 + softmax state 6 + loader state and addresses ~25: about 160.
// Shared memory: 2 stages x 36 KB (KV) + 16 KB (partial scores) = 88 KB <= 99 KB.
//
// FP8 cache (KvFormat::kFp8, common/config.h): the loader copies a sub-tile's raw 656-byte rows
// (41 chunks of 16 bytes: 512 e4m3, 4 fp32 scales, 64 bf16 RoPE) into one of two raw stages, and
// the whole CTA dequantizes the raw stage into ONE 16-bit stage of the layout above (q's dtype),
// which the tensor-core, softmax and epilogue code reads unchanged. Two 16-bit stages would not fit
// beside the raw ones: 36 KB + 2 x 20.5 KB (raw) + 16 KB = 93 KB <= 99 KB. The raw copies of
// sub-tile j + 1 are in flight while j is dequantized and computed, as the 16-bit copies are.
#pragma once

#include <cstdint>
#include <type_traits>

#include "../common/config.h"
#include "../common/problem.h"

namespace jax_mla::portable {

inline constexpr int kWarps = 8;
inline constexpr int kThreads = 32 * kWarps;
inline constexpr int kRowGroups = 2;                           // 16-row mma slices of the CTA
inline constexpr int kWarpsPerRowGroup = kWarps / kRowGroups;  // 4: split K (Q K^T) and V columns (P V)
inline constexpr int kBlockRows = 16 * kRowGroups;             // 32 query rows per CTA
// Row blocks of kBlockRows rows covering a request's `rows` query rows (the grid's second factor).
MLA_HOST_DEVICE int num_row_blocks(int rows) { return (rows + kBlockRows - 1) / kBlockRows; }

inline constexpr int kTileKeys = 32;                    // tokens per KV sub-tile (one pipeline stage)
inline constexpr int kTilesPerBlock = kBlockN / kTileKeys;  // 2 sub-tiles per scheduling block
inline constexpr int kBoxCols = 64;                     // columns of one box: 128-byte shared rows
inline constexpr int kBoxes = kHeadDimQK / kBoxCols;    // 9 boxes per sub-tile (Q K^T)
inline constexpr int kBoxesV = kHeadDimV / kBoxCols;    // 8 of them hold V (P V)
inline constexpr int kChunksPerBoxRow = kBoxCols * 2 / 16;  // 8 x 16-byte chunks (cp.async, ldmatrix)
inline constexpr int kBoxBytes = kTileKeys * kBoxCols * 2;  // 4 KB
inline constexpr int kStageBytes = kBoxes * kBoxBytes;      // 36 KB
inline constexpr int kStages = 2;

inline constexpr int kKSteps = kHeadDimQK / 16;                 // 36 k-steps of Q K^T
inline constexpr int kKStepsPerWarp = kKSteps / kWarpsPerRowGroup;  // 9: one per box
inline constexpr int kKeyTiles = kTileKeys / 8;                 // 4 n-tiles of scores per sub-tile
inline constexpr int kColsPerWarp = kHeadDimV / kWarpsPerRowGroup;  // 128 columns of O per warp
inline constexpr int kOTiles = kColsPerWarp / 8;                // 16 n-tiles of O per warp

static_assert(kBlockN % kTileKeys == 0, "a scheduling block is a whole number of sub-tiles");
static_assert(kTilesPerBlock >= 2,
              "the loader's two bad-request flags need every piece of work to span >= 2 sub-tiles");
static_assert(kTileKeys * kChunksPerBoxRow == kThreads,
              "each thread copies exactly one 16-byte chunk of every box of a sub-tile");
static_assert(kKSteps == kBoxes * kWarpsPerRowGroup, "each warp of a row group takes one k-step per box");
static_assert(kBoxesV == 2 * kWarpsPerRowGroup, "each warp's 128 columns of O are two whole V boxes");
static_assert(kTileKeys % 16 == 0, "P V runs over the sub-tile's keys in k-steps of 16");

// Shared memory of one CTA.
template <typename Element>
struct SharedStorage {
  // (stage, box, BLK_N / 2 = 32 tokens, 64 columns): box b holds columns [64 b, 64 b + 64) of the
  // sub-tile's 32 cache rows, one 128-byte row per token, with the 16-byte chunk c of row r stored
  // at chunk c ^ (r % 8) so that ldmatrix's 8 rows hit 8 different bank groups.
  Element kv[kStages][kBoxes][kTileKeys][kBoxCols];
  // (row group, source warp, key n-tile, lane): each warp's partial scores (16 rows, 32 keys) in
  // mma accumulator order, one float4 per lane and n-tile.
  float4 partial_scores[kRowGroups][kWarpsPerRowGroup][kKeyTiles][32];
};

// FP8 rows: 16-byte chunks per row; thread (row, chunk c) of the 16-bit mapping copies chunks
// c, c + 8, ... of its token's row (kFp8CopiesPerThread at most).
inline constexpr int kFp8RowChunks = kFp8RowBytes / 16;
inline constexpr int kFp8CopiesPerThread = (kFp8RowChunks + kChunksPerBoxRow - 1) / kChunksPerBoxRow;
static_assert(kFp8RowBytes % 16 == 0, "FP8 rows must be whole 16-byte cp.async chunks");
static_assert(kFp8TileCols % kBoxCols == 0, "a 64-column box must lie inside one FP8 scale tile");
static_assert(kFp8RopeOffset % 16 == 0 && kHeadDimRope == kBoxCols,
              "the RoPE part is the last box: one 16-byte chunk of 8 bf16 per thread");

// Shared memory of one CTA over an FP8 cache.
template <typename Element>
struct SharedStorageFp8 {
  // The dequantized sub-tile: SharedStorage's kv with its one stage (same swizzled layout).
  Element kv[1][kBoxes][kTileKeys][kBoxCols];
  float4 partial_scores[kRowGroups][kWarpsPerRowGroup][kKeyTiles][32];
  // (stage, token, byte): the raw rows of a sub-tile, as in the cache (16-byte aligned rows).
  uint8_t raw[kStages][kTileKeys][kFp8RowBytes];
};

template <typename Element, KvFormat kFormat>
using Storage = std::conditional_t<kFormat == KvFormat::kFp8, SharedStorageFp8<Element>, SharedStorage<Element>>;

template <typename Element, KvFormat kFormat = KvFormat::kDense>
inline constexpr int kSmemBytes = sizeof(Storage<Element, kFormat>);
// The smallest per-block shared-memory limit among the GPUs the kernel targets (SM86 / SM89 / SM120).
inline constexpr int kMinSmemOptIn = 101376;
static_assert(sizeof(SharedStorage<uint16_t>) <= kMinSmemOptIn, "exceeds the 99 KB opt-in limit of SM86/89/120");
static_assert(sizeof(SharedStorage<uint16_t>) == kStages * kStageBytes + 16 * 1024, "layout as budgeted above");
static_assert(sizeof(SharedStorageFp8<uint16_t>) <= kMinSmemOptIn, "FP8: exceeds the 99 KB opt-in limit");
static_assert(sizeof(SharedStorageFp8<uint16_t>) == kStageBytes + 16 * 1024 + kStages * kTileKeys * kFp8RowBytes,
              "FP8 layout as budgeted above");

// Named barriers (id 0 is __syncthreads): one per row group, among its 4 warps.
inline constexpr int kBarPartialScores = 1;  // + row group: partial scores of the sub-tile written

}  // namespace jax_mla::portable
