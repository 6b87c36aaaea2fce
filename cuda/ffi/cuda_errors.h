// The runtime's outcomes (runtime/device.h Status, runtime/decode_launch.h LaunchStatus) as XLA FFI
// errors, for the CUDA handlers (cuda_handler.cu, cuda_sparse_handler.cu). CUDA builds only.
#pragma once

#include <string>

#include "runtime/cuda_calls.h"
#include "runtime/decode_launch.h"
#include "runtime/device.h"
#include "xla/ffi/api/ffi.h"

namespace jax_mla {
namespace ffi_args {

namespace ffi = ::xla::ffi;

inline ffi::Error to_ffi(const Status& s) {
  switch (s.code) {
    case Status::Code::kOk: return ffi::Error::Success();
    case Status::Code::kInvalidArgument: return ffi::Error(ffi::ErrorCode::kInvalidArgument, s.message);
    case Status::Code::kUnimplemented: return ffi::Error(ffi::ErrorCode::kUnimplemented, s.message);
    case Status::Code::kInternal: break;
  }
  return ffi::Error(ffi::ErrorCode::kInternal, s.message);
}

// A failed launch sequence: the CUDA error of the step that failed, or an internal error naming
// the step (a launch refused before reaching CUDA) prefixed with the target.
inline ffi::Error launch_error(const char* target, const LaunchStatus& st) {
  if (st.error != cudaSuccess) return to_ffi(cuda_status(st.what, st.error));
  return ffi::Error(ffi::ErrorCode::kInternal, std::string(target) + ": " + st.what);
}

}  // namespace ffi_args
}  // namespace jax_mla
