// What only the SM90 launch decides, beside the problem (common/problem.h): whether the decode
// kernel merges the split-KV partials itself (split_merge.cuh) and where its arrival counters live.
// Host code (launch_decode, cuda/ffi/decode_launch.cu) makes the plan; the kernel receives it as
// its own parameter, next to the problem.
#pragma once

#include <cstdint>
#include <cstdlib>

#include "../common/config.h"
#include "../common/problem.h"

namespace jax_mla::sm90 {

struct LaunchPlan {
  // Merge the split-KV partials inside the decode kernel (split_merge.cuh); no combine kernel runs
  // after it. Only where fused_merge_fits and merge_counters is given.
  bool fused_merge;
  // (b, ceil(rows / 64)) int32 arrival counters of the merge, zeroed before the kernel (by the
  // scheduler kernel or, for a precomputed schedule, a memset). Read only when fused_merge.
  int* merge_counters;
  // FP8 cache: the owner of each tile (its consumer warpgroup's four warps) rewrites a share of it
  // beside warps 1-3 of warpgroup 0, right before its S (fp8_tiles.cuh). Where few query rows
  // leave the consumers idle most of a tile (rows <= kOwnerRewriteMaxRows).
  bool owner_rewrites;
  // EXPERIMENT (JAX_MLA_SCORES_AFTER_RELEASE=1, A/B only): a 16-bit cache's other consumer releases
  // its boxes of tile g before starting S of tile g + 1, as the FP8 cache's does (mainloop.cuh).
  bool scores_after_release;
};

inline constexpr int kOwnerRewriteMaxRows = 64;

// The in-kernel split merge: the pieces of a request wait for each other, so every CTA of the grid
// must be resident at once (one decode CTA fills an SM: at most sm_count CTAs; sm_count <= 0:
// unknown, 132 assumed), and at most kFusedMergeMaxParts parts (a row's splits, one LSE per lane
// and register: 160 covers the 132 parts of one row block per SM on an H100 / H200).
inline constexpr int kFusedMergeMaxParts = 160;
inline bool fused_merge_fits(const DecodeProblem& p, int sm_count) {
  const int64_t sms = sm_count > 0 ? sm_count : 132;
  return p.num_parts <= kFusedMergeMaxParts && static_cast<int64_t>(num_row_blocks(p.rows)) * p.num_parts <= sms;
}

// EXPERIMENT: JAX_MLA_FP8_OWNER_ROWS overrides kOwnerRewriteMaxRows (A/B only; not for main).
inline int owner_rewrite_max_rows() {
  const char* v = std::getenv("JAX_MLA_FP8_OWNER_ROWS");
  return v != nullptr ? std::atoi(v) : kOwnerRewriteMaxRows;
}

// The plan for problem p on a GPU of sm_count SMs; merge_counters: the workspace's counters
// (common/workspace.h), or nullptr for no in-kernel merge.
inline LaunchPlan make_launch_plan(const DecodeProblem& p, int sm_count, int* merge_counters) {
  LaunchPlan plan;
  plan.fused_merge = merge_counters != nullptr && fused_merge_fits(p, sm_count);
  plan.merge_counters = merge_counters;
  plan.owner_rewrites = p.kv_format == KvFormat::kFp8 && p.rows <= owner_rewrite_max_rows();
  const char* after = std::getenv("JAX_MLA_SCORES_AFTER_RELEASE");
  plan.scores_after_release = after != nullptr && after[0] == '1';
  return plan;
}

}  // namespace jax_mla::sm90
