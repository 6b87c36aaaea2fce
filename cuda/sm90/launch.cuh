// Definitions behind launch.h, included once per element type by instantiations/*.cu.
#pragma once

#include "decode_kernel.cuh"
#include "../common/launch.h"
#include "launch.h"

namespace jax_mla::sm90 {

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
cudaError_t launch_decode(const DecodeProblem& p, const LaunchPlan& plan, const CUtensorMap& q_map,
                          const CUtensorMap& kv_map, const CUtensorMap& kv_group_map,
                          const CUtensorMap& kv_scale_map, cudaStream_t stream, const WatchdogParams* watchdog) {
  // Row blocks first: the row blocks of one part, which read the same KV tiles, get consecutive CTA ids
  // (decode_kernel.cuh).
  const dim3 grid(num_row_blocks(p.rows), p.num_parts);
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = pdl_launch_config(grid, dim3(kThreads), kSmemBytes<Element>, stream, &attr);
  if (watchdog != nullptr) {
    if (plan.fused_merge) return cudaErrorInvalidValue;  // the watchdog instantiation never merges
    return cudaLaunchKernelEx(&cfg, decode_kernel<Element, true, kFormat>, p, plan, q_map, kv_map, kv_group_map,
                              kv_scale_map, *watchdog);
  }
  return cudaLaunchKernelEx(&cfg, decode_kernel<Element, false, kFormat>, p, plan, q_map, kv_map, kv_group_map,
                            kv_scale_map, WatchdogParams{});
}

}  // namespace jax_mla::sm90
