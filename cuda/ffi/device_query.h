// CUDA device queries the extension module needs outside any handler (the default num_parts).
// Defined in device_query.cu, which is compiled only with CUDA (JAX_MLA_WITH_CUDA).
#pragma once

namespace jax_mla {

// Multiprocessor count of CUDA device 0; 0 when there is no device, no driver, or any error.
int cuda_sm_count();

// How often the CUDA decode handler's execute stage ran, and how many of those runs found their
// stream capturing into a CUDA graph (XLA command buffers trace the custom call; replays of the
// graph do not run the handler). For tests and diagnostics; defined in cuda_handler.cu.
struct CudaCallStats {
  long long decode_calls;
  long long decode_captured;
  long long sm90_fused_merge_launches;  // decode calls whose SM90 kernel merged the splits itself
};
CudaCallStats cuda_call_stats();

}  // namespace jax_mla
