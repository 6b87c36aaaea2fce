// Definitions behind launch.h, included once per element type by instantiations/*.cu.
#pragma once

#include "decode_kernel.cuh"
#include "launch.h"

namespace jax_mla::sm90 {

template <typename Element>
cudaError_t setup_decode() {
  return cudaFuncSetAttribute(decode_kernel<Element>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              kSmemBytes<Element>);
}

template <typename Element>
cudaError_t launch_decode(const DecodeParams& p, const CUtensorMap& q_map, const CUtensorMap& kv_map,
                          cudaStream_t stream) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(p.num_parts, (p.rows + kBlockM - 1) / kBlockM);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmemBytes<Element>;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, decode_kernel<Element>, p, q_map, kv_map);
}

}  // namespace jax_mla::sm90
