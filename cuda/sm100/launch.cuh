// Definitions behind launch.h, included once per (element type, cache format) by instantiations/*.cu.
#pragma once

#include "../common/launch.h"
#include "decode_kernel.cuh"
#include "launch.h"

namespace jax_mla::sm100 {

template <typename Element, KvFormat kFormat>
cudaError_t setup_decode() {
  cudaError_t e = cudaFuncSetAttribute(decode_kernel<Element, false, kFormat>,
                                       cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes<Element>);
  if (e == cudaSuccess) {
    e = cudaFuncSetAttribute(decode_kernel<Element, true, kFormat>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kSmemBytes<Element>);
  }
  return e;
}

template <typename Element, KvFormat kFormat>
cudaError_t launch_decode(const DecodeProblem& p, const CUtensorMap& q_map, const CUtensorMap& kv_map,
                          const CUtensorMap& kv_rope_map, const CUtensorMap& kv_scale_map, cudaStream_t stream,
                          const WatchdogParams* watchdog) {
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = pdl_launch_config(dim3(p.num_parts, (p.rows + kBM - 1) / kBM), dim3(kThreads),
                                                   kSmemBytes<Element>, stream, &attr);
  if (watchdog != nullptr) {
    return cudaLaunchKernelEx(&cfg, decode_kernel<Element, true, kFormat>, p, q_map, kv_map, kv_rope_map,
                              kv_scale_map, *watchdog);
  }
  return cudaLaunchKernelEx(&cfg, decode_kernel<Element, false, kFormat>, p, q_map, kv_map, kv_rope_map, kv_scale_map,
                            WatchdogParams{});
}

}  // namespace jax_mla::sm100
