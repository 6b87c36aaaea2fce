// What only the SM90 launch decides, beside the problem (common/problem.h): whether the decode
// kernel merges the split-KV partials itself (split_merge.cuh) and where its arrival counters live.
// Host code (launch_decode, cuda/ffi/decode_launch.cu) makes the plan; the kernel receives it as
// its own parameter, next to the problem.
#pragma once

#include <cstdint>

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
};

// The in-kernel split merge: the pieces of a request wait for each other, so every CTA of the grid
// must be resident at once (one decode CTA fills an SM: at most sm_count CTAs; sm_count <= 0:
// unknown, 132 assumed), and at most kFusedMergeMaxParts parts (a row's splits, one LSE per lane
// and register: 160 covers the 132 parts of one row block per SM on an H100 / H200).
inline constexpr int kFusedMergeMaxParts = 160;
inline bool fused_merge_fits(const DecodeProblem& p, int sm_count) {
  const int64_t sms = sm_count > 0 ? sm_count : 132;
  return p.num_parts <= kFusedMergeMaxParts && static_cast<int64_t>(num_row_blocks(p.rows)) * p.num_parts <= sms;
}

// The plan for problem p on a GPU of sm_count SMs; merge_counters: the workspace's counters
// (common/workspace.h), or nullptr for no in-kernel merge.
inline LaunchPlan make_launch_plan(const DecodeProblem& p, int sm_count, int* merge_counters) {
  LaunchPlan plan;
  plan.fused_merge = merge_counters != nullptr && fused_merge_fits(p, sm_count);
  plan.merge_counters = merge_counters;
  return plan;
}

}  // namespace jax_mla::sm90
