// Portable decode kernel, fp16 q over an FP8 cache (656-byte rows dequantized to fp16 in shared memory).
#include <cuda_fp16.h>

#include "../launch.cuh"

namespace jax_mla::portable {
template cudaError_t setup_decode<__half, KvFormat::kFp8>();
template cudaError_t launch_decode<__half, KvFormat::kFp8>(const DecodeProblem&, cudaStream_t);
}  // namespace jax_mla::portable
