// Which decode kernel a CUDA device uses, for jax_mla.kernel_info() (through the extension module).
// Defined in cuda_handler.cu, which owns the per-device state; CUDA builds only.
#pragma once

#include <string>

#include "ffi/kernel_select.h"

namespace jax_mla {

// The decode kernels compiled into this build (JAX_MLA_HAVE_* from the build system); defined in
// decode_launch.cu.
BuiltKernels built_kernels();

struct DeviceKernelInfo {
  int cc_major = 0, cc_minor = 0;
  std::string kernel;             // what kernel="auto" runs there (after JAX_MLA_KERNEL and the self-check)
  bool fell_back = false;         // auto took portable because the candidate failed its self-check
  std::string self_check;         // "not run", "passed" or "failed"
  std::string self_check_kernel;  // the kernel that was checked ("" when none)
  std::string self_check_detail;  // why it failed
  std::string env_kernel;         // JAX_MLA_KERNEL as read by this process ("" when unset)
  std::string env_self_check;     // JAX_MLA_SELFCHECK as read by this process
  std::string error;              // non-empty: the device cannot be used (the message says why)
};

// Initializes CUDA device `ordinal` for jax_mla if no jax_mla op did yet (the same work as the FFI
// initialize stage: kernel setup and, where needed, the self-check), then reports its selection.
DeviceKernelInfo device_kernel_info(int ordinal);

}  // namespace jax_mla
