// SM100 decode kernel, fp16 q over an FP8 cache (one instantiation per file keeps compile times low).
#include <cuda_fp16.h>

#include "../launch.cuh"

namespace jax_mla::sm100 {
template cudaError_t setup_decode<__half, KvFormat::kFp8>();
template cudaError_t launch_decode<__half, KvFormat::kFp8>(const DecodeProblem&, const CUtensorMap&,
                                                   const CUtensorMap&, const CUtensorMap&, const CUtensorMap&,
                                                   cudaStream_t, const WatchdogParams*);
}  // namespace jax_mla::sm100
