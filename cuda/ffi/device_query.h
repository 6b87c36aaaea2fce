// CUDA device queries the extension module needs outside any handler (the default num_parts).
// Defined in device_query.cu, which is compiled only with CUDA (JAX_MLA_WITH_CUDA).
#pragma once

namespace jax_mla {

// Multiprocessor count of CUDA device 0; 0 when there is no device, no driver, or any error.
int cuda_sm_count();

}  // namespace jax_mla
