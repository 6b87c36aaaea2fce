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

// One-time per-device setup (opt-in shared memory) of the portable kernel and, on compute capability
// 9.0 in an sm_90a build, the SM90 kernel. Call from the initialize stage.
cudaError_t setup_decode_kernels(int cc_major, int cc_minor);

// The SM100 kernel's setup, for a device of compute capability 10.0 / 10.3 whose kernel is in the
// build (cudaErrorInvalidDeviceFunction in a build without it). Separate from the others because its
// failure must not fail the initialization: the kernel never ran on hardware, so a failure here is
// a failed self-check and auto falls back to the portable kernel (runtime/device.cu).
cudaError_t setup_sm100_kernel();

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
