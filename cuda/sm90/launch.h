// Host entry points of the SM90 decode kernel.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "../common/problem.h"
#include "../common/watchdog_params.h"
#include "launch_plan.h"

namespace jax_mla::sm90 {

// One-time per-device setup (opt-in shared memory); call from the FFI initialize stage.
template <typename Element>
cudaError_t setup_decode();

// Launches the decode kernel over grid (ceil(p.rows / 64), p.num_parts) with programmatic dependent
// launch; plan: make_launch_plan (launch_plan.h). q_map: (b * rows, 576) box (64, 64); kv_map: (num_pages * page_size, 576)
// box (min(page_size, 64), 64); kv_group_map: the cache's column-box view with box (64, 64, 3) for
// pages of >= 64 tokens (kv_producer.cuh kBoxesPerGroup), else unused. watchdog: null for the
// production kernel, else the self-check's instantiation with bounded waits (common/watchdog.cuh),
// which needs plan.fused_merge == false.
template <typename Element>
cudaError_t launch_decode(const DecodeProblem& p, const LaunchPlan& plan, const CUtensorMap& q_map,
                          const CUtensorMap& kv_map, const CUtensorMap& kv_group_map, cudaStream_t stream,
                          const WatchdogParams* watchdog = nullptr);

}  // namespace jax_mla::sm90
