// The self-check of a decode kernel against the portable kernel: both run the same small random
// problem on the current device and their results are compared. The initialize stage runs it once
// per device for the kernel "auto" would pick when that kernel needs it (kernel_select.h). It
// allocates (stream-ordered, on its own stream) and synchronises that stream: never call it from
// an execute stage.
#pragma once

#include <string>

#include "runtime/kernel_select.h"

namespace jax_mla {

struct SelfCheckReport {
  bool passed = false;
  std::string detail;  // what differed, or which CUDA call failed; empty when passed
};

// candidate: kSm90 or kSm100, already set up (setup_decode_kernels). inject_fault corrupts the
// candidate's output before the comparison (JAX_MLA_SELFCHECK=fault), so the fallback can be tested
// on a healthy GPU.
SelfCheckReport run_self_check(Kernel candidate, bool inject_fault);

}  // namespace jax_mla
