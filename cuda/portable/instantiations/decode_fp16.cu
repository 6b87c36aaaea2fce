// Portable decode kernel, fp16.
#include <cuda_fp16.h>

#include "../launch.cuh"

namespace jax_mla::portable {
template cudaError_t setup_decode<__half>();
template cudaError_t launch_decode<__half>(const DecodeProblem&, cudaStream_t);
}  // namespace jax_mla::portable
