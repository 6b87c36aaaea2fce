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
  long long sm90_fused_merge_launches; // decode calls whose kernel merged the splits (JAX_MLA_SM90_MERGE auto / fused)
};
CudaCallStats cuda_call_stats();

// The SM90 split-merge mode of later decode calls in this process, overriding JAX_MLA_SM90_MERGE:
// -1 back to the variable, 0 combine kernel, 1 fused (cuda/sm90/split_merge.cuh), 2 auto (the
// default: the measured choice, today the same as fused). For benchmarks
// that compare both in one process (benchmarks/bench_decode.py --merge). Returns the previous
// override. A CUDA graph keeps the mode it was captured with.
int set_sm90_merge_override(int mode);

}  // namespace jax_mla
