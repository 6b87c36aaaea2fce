// Handler symbols the extension module (python/module.cc) registers with XLA. One definition each:
// CPU handlers in cpu_handler.cc, CUDA handlers in cuda_handler.cu (built only with CUDA).
#pragma once

#include "xla/ffi/api/ffi.h"

// CPU platform: single-stage handlers.
XLA_FFI_DECLARE_HANDLER_SYMBOL(MlaDecodeCpu);          // target jax_mla_decode
XLA_FFI_DECLARE_HANDLER_SYMBOL(MlaDecodeScheduleCpu);  // target jax_mla_decode_schedule
XLA_FFI_DECLARE_HANDLER_SYMBOL(MlaDecodeSparseCpu);    // target jax_mla_decode_sparse (cpu_sparse_handler.cc)

#ifdef JAX_MLA_WITH_CUDA
// CUDA platform. All targets share an initialize stage that sets the device up once
// (runtime/device.h), so the execute stages only launch work, which keeps them CUDA-graph (XLA
// command buffer) compatible.
XLA_FFI_DECLARE_HANDLER_SYMBOL(MlaDecodeCudaInitialize);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MlaDecodeCudaExecute);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MlaDecodeScheduleCudaExecute);
XLA_FFI_DECLARE_HANDLER_SYMBOL(MlaDecodeSparseCudaExecute);  // cuda_sparse_handler.cu
#endif
