// The self-check of a decode kernel against the portable kernel: both run the cases of
// runtime/self_check_cases.h on the current device and their results are compared. The initialize
// stage runs it once per device for the kernel "auto" would pick when that kernel needs it
// (kernel_select.h). It allocates (stream-ordered, on its own stream) and synchronises that stream:
// never call it from an execute stage.
//
// The candidate runs as its watchdog instantiation (common/watchdog.cuh): a barrier wait that does
// not complete within the budget ends the kernel (no trap) and fails the check, so a hanging kernel
// costs the initialization about one budget and leaves the context usable for the fallback. A kernel
// that faults (illegal instruction, out-of-bounds access) still poisons the context: no in-process
// check can recover from that.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/kernel_select.h"

namespace jax_mla {

// Per candidate launch; a healthy run of the largest case takes well under a millisecond, so only
// a wait that can never complete (or a GPU preempted for this long) reaches it.
inline constexpr uint64_t kSelfCheckWatchdogNs = 500ull * 1000 * 1000;

struct SelfCheckReport {
  bool passed = false;
  std::string detail;             // what differed, or which CUDA call failed; empty when passed
  bool watchdog_expired = false;  // the candidate's watchdog gave up on a barrier wait
  int cases = 0;                  // (format, dtype, case) runs that passed before the first failure
  double seconds = 0;             // wall time of the whole check (inputs on the host included)
  float device_ms = 0;            // GPU time of the kernels' runs (both kernels, every case)
};

// candidate: kSm90 or kSm100, already set up (setup_decode_kernels). mode (JAX_MLA_SELFCHECK):
// kFault corrupts one element of the candidate's result before the comparison and kHang makes the
// candidate's producer withhold one barrier arrival, so that the fallback and the watchdog can be
// tested on a healthy GPU; kDefault and kForce check as they are.
SelfCheckReport run_self_check(Kernel candidate, SelfCheckMode mode, uint64_t watchdog_budget_ns = kSelfCheckWatchdogNs);

}  // namespace jax_mla
