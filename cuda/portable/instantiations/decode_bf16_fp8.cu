// Portable decode kernel, bf16 q over an FP8 cache (656-byte rows dequantized to bf16 in shared memory).
#include <cuda_bf16.h>

#include "../launch.cuh"

namespace jax_mla::portable {
template cudaError_t setup_decode<__nv_bfloat16, KvFormat::kFp8>();
template cudaError_t launch_decode<__nv_bfloat16, KvFormat::kFp8>(const DecodeProblem&, cudaStream_t);
}  // namespace jax_mla::portable
