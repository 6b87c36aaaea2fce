// SM100 decode kernel, fp16 (one instantiation per file keeps compile times and memory per file low).
#include <cuda_fp16.h>

#include "../launch.cuh"

namespace jax_mla::sm100 {
template cudaError_t setup_decode<__half, KvFormat::kDense>();
template cudaError_t launch_decode<__half, KvFormat::kDense>(const DecodeProblem&, const CUtensorMap&,
                                                   const CUtensorMap&, const CUtensorMap&, const CUtensorMap&,
                                                   cudaStream_t, const WatchdogParams*);
}  // namespace jax_mla::sm100
