// The split-plan policy in force (common/scheduler.h, SplitPlanPolicy): the one process-wide
// choice that the CPU handler, the CUDA handlers (device scheduler) and the module's host planner
// (_ext.plan_schedule) all read, so that every schedule of the process is planned the same way.
//
// JAX_MLA_SPLIT_PLAN = auto (default) | line | pieces, read once; _ext.set_split_plan overrides it
// for later calls (the benchmark's in-process A/B). It is a tuning switch, not semantics: every
// plan covers every KV block exactly once, and the output differs only by float rounding.
// A schedule passed to a decode call (jax_mla.decode_schedule) carries the plan it was computed
// with: the GPU kernels follow it as it is; the CPU handler requires it to equal its own plan.
//
// Header-only: function-local statics of inline functions are one object per shared library.
#pragma once

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/scheduler.h"

namespace jax_mla {

inline constexpr const char* kSplitPlanNames[] = {"auto", "line", "pieces"};  // SplitPlanPolicy order

// Index of `name` in kSplitPlanNames, or -1.
inline int split_plan_index(const char* name) {
  for (int i = 0; i < 3; ++i) {
    if (std::strcmp(name, kSplitPlanNames[i]) == 0) return i;
  }
  return -1;
}

// JAX_MLA_SPLIT_PLAN, read once. An unknown value gives auto with a warning on stderr (as the
// other tuning switches: a typo must not pass for a measured variant).
inline SplitPlanPolicy split_plan_from_env() {
  static const SplitPlanPolicy policy = [] {
    const char* v = std::getenv("JAX_MLA_SPLIT_PLAN");
    if (v == nullptr || *v == 0) return SplitPlanPolicy::kAuto;
    const int i = split_plan_index(v);
    if (i < 0) {
      std::fprintf(stderr, "jax_mla: JAX_MLA_SPLIT_PLAN='%s' is not one of auto, line, pieces; using auto\n", v);
      return SplitPlanPolicy::kAuto;
    }
    return static_cast<SplitPlanPolicy>(i);
  }();
  return policy;
}

// -1: the environment decides; else a SplitPlanPolicy.
inline std::atomic<int>& split_plan_override() {
  static std::atomic<int> value{-1};
  return value;
}

inline SplitPlanPolicy split_plan_policy() {
  const int o = split_plan_override().load(std::memory_order_relaxed);
  return o >= 0 ? static_cast<SplitPlanPolicy>(o) : split_plan_from_env();
}

// Sets the override (-1: back to the environment); returns the previous one.
inline int set_split_plan_override(int policy) { return split_plan_override().exchange(policy); }

}  // namespace jax_mla
