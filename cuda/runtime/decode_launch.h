// Launching one decode with a chosen kernel: the in-op schedule (when none was passed), the decode
// kernel, the combine. Shared by the execute stage and the self-check, so both run exactly the same
// launch sequence. Host code only: nothing here allocates, synchronises or queries the stream, so
// it is safe under CUDA-graph capture.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/problem.h"
#include "common/watchdog_params.h"
#include "runtime/kernel_select.h"

namespace jax_mla {

// One-time per-device setup of every decode kernel that can run on compute capability
// (cc_major, cc_minor) in this build (opt-in shared memory). Call from the initialize stage.
cudaError_t setup_decode_kernels(int cc_major, int cc_minor);

struct LaunchStatus {
  cudaError_t error = cudaSuccess;
  const char* what = nullptr;  // which step failed ("decode kernel launch", a TMA descriptor, ...)
  bool fused_merge = false;    // the decode kernel merged the split requests (no combine kernel ran)
  bool ok() const { return what == nullptr; }
};

// p: the validated problem with partial_lse / partial_out pointing into the workspace. When
// p.schedule is null the schedule is planned on the device into schedule_scratch
// (schedule_size(b, num_parts) int32) first. kernel: kSm90, kSm100 or kPortable. sm_count: the
// device's SMs (0: unknown) for sizing grids; merge_counters: the workspace's SM90 merge counters
// (nullptr: no in-kernel merge). watchdog (the self-check's candidate runs only): launch the SM90 /
// SM100 kernel's instantiation whose barrier waits give up at a deadline (common/watchdog.cuh; no
// in-kernel merge then); the portable kernel has no barrier waits and ignores it.
LaunchStatus launch_decode_kernel(Kernel kernel, DecodeProblem p, int sm_count, int* merge_counters,
                                  int32_t* schedule_scratch, cudaStream_t stream,
                                  const WatchdogParams* watchdog = nullptr);

}  // namespace jax_mla
