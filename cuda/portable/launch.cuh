// Definitions behind launch.h, included once per (element type, cache format) by instantiations/*.cu.
#pragma once

#include <cstdint>

#include "../common/launch.h"
#include "decode_kernel.cuh"
#include "launch.h"

namespace jax_mla::portable {

template <typename Element, KvFormat kFormat>
cudaError_t setup_decode() {
  return cudaFuncSetAttribute(decode_kernel<Element, kFormat>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              kSmemBytes<Element, kFormat>);
}

template <typename Element, KvFormat kFormat>
cudaError_t launch_decode(const DecodeProblem& p, cudaStream_t stream) {
  if (p.kv_format != kFormat) return cudaErrorInvalidValue;  // the caller dispatches on p.kv_format
  const int64_t ctas = static_cast<int64_t>(p.num_parts) * num_row_blocks(p.rows);
  if (ctas > INT32_MAX) return cudaErrorInvalidConfiguration;  // an absurd num_parts
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = pdl_launch_config(dim3(static_cast<unsigned>(ctas)), dim3(kThreads),
                                                   kSmemBytes<Element, kFormat>, stream, &attr, /*programmatic=*/false);
  return cudaLaunchKernelEx(&cfg, decode_kernel<Element, kFormat>, p);
}

}  // namespace jax_mla::portable
