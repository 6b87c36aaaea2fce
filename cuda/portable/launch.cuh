// Definitions behind launch.h, included once per element type by instantiations/*.cu.
#pragma once

#include <cstdint>

#include "../common/launch.h"
#include "decode_kernel.cuh"
#include "launch.h"

namespace jax_mla::portable {

template <typename Element>
cudaError_t setup_decode() {
  return cudaFuncSetAttribute(decode_kernel<Element>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              kSmemBytes<Element>);
}

template <typename Element>
cudaError_t launch_decode(const DecodeProblem& p, cudaStream_t stream) {
  const int64_t ctas = static_cast<int64_t>(p.num_parts) * num_row_blocks(p.rows);
  if (ctas > INT32_MAX) return cudaErrorInvalidConfiguration;  // an absurd num_parts
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = pdl_launch_config(dim3(static_cast<unsigned>(ctas)), dim3(kThreads),
                                                   kSmemBytes<Element>, stream, &attr, /*programmatic=*/false);
  return cudaLaunchKernelEx(&cfg, decode_kernel<Element>, p);
}

}  // namespace jax_mla::portable
