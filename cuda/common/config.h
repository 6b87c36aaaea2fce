// Compile-time constants shared by every jax-mla kernel (CPU, SM90, SM100, portable).
//
// The operation: absorbed MLA decode. Every cached token carries one 576-wide latent row
// (512 compressed-KV values + 64 decoupled RoPE key values). Scores use all 576 columns,
// values are the first 512 columns of the same row. See docs/design.md.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define MLA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define MLA_HOST_DEVICE inline
#endif

namespace jax_mla {

// Width of one cached latent row and of one query head (K dimension of Q K^T).
inline constexpr int kHeadDimQK = 576;
// Width of V (the first kHeadDimV columns of the same row) and of the output.
inline constexpr int kHeadDimV = 512;
// RoPE part of the row, after the latent part.
inline constexpr int kHeadDimRope = kHeadDimQK - kHeadDimV;

// The FP8 latent cache (FlashMLA's DeepSeek-V3.2 layout, packed by jax_mla/_fp8.py): one token is
// kFp8RowBytes bytes instead of 576 16-bit values:
//   [0, 512)    the kHeadDimV latent values as float8_e4m3fn, in kFp8Tiles tiles of kFp8TileCols;
//   [512, 528)  one float32 scale per tile (little-endian); a latent value is float(e4m3) * scale;
//   [528, 656)  the kHeadDimRope RoPE values as bfloat16 (little-endian), not quantized.
// Keys are the whole dequantized row, values its latent part, exactly as for a 16-bit cache.
inline constexpr int kFp8TileCols = 128;
inline constexpr int kFp8Tiles = kHeadDimV / kFp8TileCols;
inline constexpr int kFp8ScalesOffset = kHeadDimV;                       // bytes of e4m3 values first
inline constexpr int kFp8RopeOffset = kFp8ScalesOffset + 4 * kFp8Tiles;  // then the float32 scales
inline constexpr int kFp8RowBytes = kFp8RopeOffset + 2 * kHeadDimRope;   // then the bf16 RoPE values
static_assert(kHeadDimV % kFp8TileCols == 0, "FP8 scale tiles must divide the latent part");
static_assert(kFp8RowBytes == 656, "FlashMLA's V32 FP8 row is 656 bytes");

// Tokens per scheduling block. The split-KV scheduler hands out work in whole blocks of
// this many cached tokens, and the GPU kernels load KV tiles of exactly this many rows,
// so one scheduled block is one KV tile (BN_QK).
inline constexpr int kBlockN = 64;
// The GPU kernels' FP8 tile rewrite (common/fp8_tile.cuh dequantize_tile): a warp step converts
// kFp8RowsPerStep whole rows, each lane kFp8ChunksPerLane 16-byte chunks of one row's pair under one
// scale; the step is the unit of the fast-path vote.
inline constexpr int kFp8ChunksPerLane = 4;
inline constexpr int kFp8RowsPerStep = 32 * kFp8ChunksPerLane * 16 / kHeadDimV;  // 4
static_assert(kBlockN % kFp8RowsPerStep == 0);
// Query rows (s_q * h_q folded) handled by one CTA / one CPU task.
inline constexpr int kBlockM = 64;
// Row blocks of kBlockM rows covering a request's `rows` query rows.
MLA_HOST_DEVICE int num_row_blocks(int rows) { return (rows + kBlockM - 1) / kBlockM; }

// Boxes of 64 columns per TMA copy when a KV tile is loaded as grouped copies (SM90, pages of >= 64
// tokens; cuda/common/kv_producer.cuh).
inline constexpr int kBoxesPerGroup = 3;

// Fixed cost of one split in units of kBlockN-token blocks: the per-split prologue
// (loading Q, filling the pipeline) and the combine work it causes. The scheduler adds
// it to every request so that many short requests are not packed onto a single part.
inline constexpr int kFixedOverheadBlocks = 5;

// Lazy rescaling (SM100: sm100/config.h kRescaleThreshold; SM90: sm90/softmax.cuh move_reference):
// a row's softmax reference moves only when its score max grows by
// more than this (log2 units), so P = exp2(s - reference) <= 2^8 = 256. P is rounded to the 16-bit
// element type for P V: fp16's largest finite value is 65504 (just under 2^16), and a 16-bit
// float's relative rounding does not depend on magnitude, so a P up to 2^8 costs no precision. Row
// sums stay in fp32.
inline constexpr float kLazyRescaleSlack = 8.f;
static_assert(kLazyRescaleSlack >= 0.f && kLazyRescaleSlack <= 15.f, "P = exp2(<= slack) must stay finite in fp16");

// Page sizes the paged cache may use. The CPU kernel accepts any positive page size;
// the GPU kernels need a power of two in [kMinGpuPageSize, kMaxGpuPageSize] so that one
// 64-token KV tile never straddles more than one page boundary pattern they handle.
inline constexpr int kMinGpuPageSize = 16;
inline constexpr int kMaxGpuPageSize = 256;

// Limits advertised by the API (validated in Python and C++).
inline constexpr int kMaxSeqQ = 8;      // s_q: tokens per request in one decode step
inline constexpr int kMaxHeadsQ = 128;  // h_q: query heads (after tensor parallelism)

static_assert(kHeadDimV % 64 == 0, "V width must be a multiple of the 64-column TMA box");
static_assert(kHeadDimQK % 64 == 0, "QK width must be a multiple of the 64-column TMA box");
static_assert(kMinGpuPageSize <= kBlockN && kBlockN <= kMaxGpuPageSize,
              "a KV tile spans at most one page or a whole number of pages");

}  // namespace jax_mla
