// Per-device state of the CUDA handlers: the properties they need (SM count, compute capability),
// the one-time kernel setup, the self-check "auto" may need and its outcome, and the kernel
// selection on top of it. CUDA builds only.
//
// Initialization (init_device) runs once per device and process, under a mutex: it reads the
// properties, raises the shared-memory limits of every kernel the device can run and, when auto's
// candidate needs it, runs the self-check (runtime/self_check.h), which allocates and synchronises
// its own stream. The execute stages only read the state (ready_device), so they stay CUDA-graph
// (XLA command buffer) compatible. This header needs no CUDA headers (the extension module, a
// plain C++ file, includes it); runtime/cuda_calls.h has the declarations that do.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/kernel_select.h"
#include "runtime/self_check.h"

namespace jax_mla {

// The outcome of a runtime step: ok, or an error of one of the kinds the handlers report.
struct Status {
  enum class Code { kOk, kInvalidArgument, kUnimplemented, kInternal };
  Code code = Code::kOk;
  std::string message;  // the whole message, "jax_mla...: ..." (empty when ok)
  bool ok() const { return code == Code::kOk; }
};

struct DeviceState {
  int sm_count = 0;
  int cc_major = 0, cc_minor = 0;
  SelfCheckOutcome self_check = SelfCheckOutcome::kNotRun;
  Kernel self_check_kernel = Kernel::kAuto;  // the kernel that was checked (kAuto: none)
  std::string self_check_detail;             // why it failed
  // Non-empty: the SM100 kernel's setup failed on this device ("setup failed: <error>"); auto's
  // self-check then fails with it, and an explicit sm100 request is refused.
  std::string sm100_setup_error;
};

// Initializes the current CUDA device for jax_mla if that has not happened yet (the FFI initialize
// stage). Fails on an invalid JAX_MLA_SELFCHECK, a device below compute capability 8.0 or an
// ordinal above 63.
Status init_current_device();

// The current device's state, when it was initialized (else an internal error naming `target`).
Status ready_device(const char* target, const DeviceState** state);

// The kernel a call with this `kernel` attribute (and a kv_cache of FP8 rows or not) runs on that
// device (kernel_select.h, with this process's settings).
KernelSelection select_on(const DeviceState& state, int32_t kernel_attr, bool fp8_cache = false);

// Multiprocessor count of CUDA device 0; 0 when there is no device, no driver, or any error.
int cuda_sm_count();

// Which decode kernel a CUDA device uses, for jax_mla.kernel_info().
struct DeviceKernelInfo {
  int cc_major = 0, cc_minor = 0;
  std::string kernel;             // what kernel="auto" runs there (after JAX_MLA_KERNEL and the self-check)
  std::string fp8_kernel;         // ... for an FP8 kv_cache ("" when no kernel reads it there)
  bool fell_back = false;         // auto took portable because the candidate failed its self-check
  std::string self_check;         // "not run", "passed" or "failed"
  std::string self_check_kernel;  // the kernel that was checked ("" when none)
  std::string self_check_detail;  // why it failed
  std::string env_kernel;         // JAX_MLA_KERNEL as read by this process ("" when unset)
  std::string env_self_check;     // JAX_MLA_SELFCHECK as read by this process
  std::string error;              // non-empty: the device cannot be used (the message says why)
};

// Initializes CUDA device `ordinal` for jax_mla if no jax_mla op did yet (the same work as the FFI
// initialize stage), then reports its selection.
DeviceKernelInfo device_kernel_info(int ordinal);

// A test hook (jax_mla._ext.testing.run_self_check): initializes device `ordinal` like
// device_kernel_info, then runs the self-check of `kernel` (sm90 or sm100, which the device must be
// able to run) there again, now, with `mode` and a watchdog budget, and reports it; the device's
// selection is unchanged. *error is set (and the report empty) when the check cannot run.
SelfCheckReport device_self_check(int ordinal, Kernel kernel, SelfCheckMode mode, uint64_t watchdog_budget_ns,
                                  std::string* error);

}  // namespace jax_mla
