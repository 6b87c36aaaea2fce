// CUDA runtime calls the handlers and the device state share. Defined in device.cu.
#pragma once

#include <cuda_runtime.h>

#include "runtime/device.h"

namespace jax_mla {

// An internal error "jax_mla: <what>: <error name> (<error string>)".
Status cuda_status(const char* what, cudaError_t err);

// Whether `stream` is capturing into a CUDA graph (a query capture permits; for the call counters).
bool stream_capturing(cudaStream_t stream);

}  // namespace jax_mla
