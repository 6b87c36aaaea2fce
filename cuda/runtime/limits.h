// The table of the API's limits: every bound the argument checks enforce, once. The C++ checks
// (ffi/decode_args.h, the handlers) use the constants named here; the extension module exports the
// table as jax_mla._ext.limits() ({name: value}), from which jax_mla/_validate.py takes every bound
// it checks at trace time, so Python and C++ cannot disagree (tests/api/test_limits.py).
//
// The values themselves live where the kernels need them (common/config.h, common/scheduler.h);
// this table names the ones that are part of the API. Plain C++ (no CUDA).
#pragma once

#include <cstdint>
#include <limits>

#include "common/config.h"
#include "common/scheduler.h"

namespace jax_mla {

// Largest dimension (and count of tokens, pages, ...) the handlers accept: they index with int32.
inline constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();

struct Limit {
  const char* name;  // the key in _ext.limits() and the constant's name in jax_mla/_validate.py
  int64_t value;
};

inline constexpr Limit kLimits[] = {
    {"HEAD_DIM_QK", kHeadDimQK},              // q's and kv_cache's last dimension
    {"HEAD_DIM_V", kHeadDimV},                // out's last dimension
    {"MAX_SEQ_Q", kMaxSeqQ},                  // 1 <= s_q <= this
    {"MAX_HEADS_Q", kMaxHeadsQ},              // 1 <= h_q <= this
    {"BLOCK_M", kBlockM},                     // query rows per CTA / CPU task (the default num_parts)
    {"BLOCK_N", kBlockN},                     // KV tokens per scheduling block
    {"MIN_GPU_PAGE_SIZE", kMinGpuPageSize},   // the GPU kernels: a power-of-two page size in
    {"MAX_GPU_PAGE_SIZE", kMaxGpuPageSize},   //   [MIN_GPU_PAGE_SIZE, MAX_GPU_PAGE_SIZE]
    {"PART_FIELDS", kPartFields},             // schedule layout: int32 fields per part,
    {"COMBINE_HEADER", kCombineHeader},       //   the combine list's header,
    {"MANY_SPLITS", kManySplits},             //   and its many-split threshold,
    {"INVARIANT_FIELDS", kInvariantFields},   //   the trailer of a batch-invariant schedule
    {"DEFAULT_INVARIANT_CHUNK", kDefaultInvariantChunkBlocks * kBlockN},  // batch_invariant's chunk
    {"MAX_INVARIANT_CHUNK", static_cast<int64_t>(kMaxInvariantChunkBlocks) * kBlockN},  // (tokens)
    {"INT32_MAX", kIntMax},                   // dimensions, schedule sizes and token counts
    {"MAX_GPU_BATCH", kMaxScheduleBatch},     // requests a GPU call plans in the op (sparse: b * s_q)
    {"FP8_ROW_BYTES", kFp8RowBytes},          // a uint8 (FP8) kv_cache's last dimension (common/config.h),
    {"FP8_TILE_COLS", kFp8TileCols},          //   latent values per float32 scale,
    {"FP8_SCALES_OFFSET", kFp8ScalesOffset},  //   byte offset of the scales in a row
    {"FP8_ROPE_OFFSET", kFp8RopeOffset},      //   and of the bfloat16 RoPE values
};

}  // namespace jax_mla
