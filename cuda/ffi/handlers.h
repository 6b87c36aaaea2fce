// Handler symbols the extension module (module.cc) registers with XLA. One definition each:
// CPU handlers in cpu_handler.cc, CUDA handlers in cuda_handler.cu (built only with CUDA).
#pragma once

#include "xla/ffi/api/ffi.h"

// CPU platform: single-stage handlers.
XLA_FFI_DECLARE_HANDLER_SYMBOL(MlaDecodeCpu);          // target jax_mla_decode
XLA_FFI_DECLARE_HANDLER_SYMBOL(MlaDecodeScheduleCpu);  // target jax_mla_decode_schedule

#ifdef JAX_MLA_WITH_CUDA
// CUDA platform. The decode target has an initialize stage that caches device properties
// (SM count, shared-memory limit, compute capability) so the execute stage only launches work,
// which keeps it CUDA-graph (XLA command buffer) compatible.
XLA_FFI_DECLARE_HANDLER_SYMBOL(MlaDecodeCudaInitialize);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MlaDecodeCudaExecute);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MlaDecodeScheduleCudaExecute);
#endif
