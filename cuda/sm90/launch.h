// Host entry points of the SM90 decode kernel.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "../common/problem.h"
#include "../common/watchdog_params.h"
#include "launch_plan.h"

namespace jax_mla::sm90 {

// One-time per-device setup (opt-in shared memory); call from the FFI initialize stage.
template <typename Element, KvFormat kFormat = KvFormat::kDense>
cudaError_t setup_decode();

// Launches the decode kernel over grid (ceil(p.rows / 64), p.num_parts) with programmatic dependent
// launch; plan: make_launch_plan (launch_plan.h). q_map: (b * rows, 576) box (64, 64); kv_map: (num_pages * page_size, 576)
// box (min(page_size, 64), 64); kv_group_map: the cache's column-box view with box (64, 64, 3) for
// pages of >= 64 tokens (kv_producer.cuh kBoxesPerGroup), else unused; kv_scale_map unused. FP8
// cache (kFormat kFp8, fp8_tiles.cuh): kv_map the cache as (tokens, 656) bytes in boxes of
// (min(page_size, 64), 128); kv_group_map as (tokens, 328) bf16 in boxes of (min(page_size, 64), 64)
// with the 128-byte swizzle; kv_scale_map as bytes in boxes of (min(page_size, 64), 16). watchdog: null for the
// production kernel, else the self-check's instantiation with bounded waits (common/watchdog.cuh),
// which needs plan.fused_merge == false.
template <typename Element, KvFormat kFormat = KvFormat::kDense>
cudaError_t launch_decode(const DecodeProblem& p, const LaunchPlan& plan, const CUtensorMap& q_map,
                          const CUtensorMap& kv_map, const CUtensorMap& kv_group_map,
                          const CUtensorMap& kv_scale_map, cudaStream_t stream, const WatchdogParams* watchdog = nullptr);

}  // namespace jax_mla::sm90
