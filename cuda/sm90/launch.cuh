// Definitions behind launch.h, included once per element type by instantiations/*.cu.
#pragma once

#include "decode_kernel.cuh"
#include "../common/launch.h"
#include "launch.h"

namespace jax_mla::sm90 {

template <typename Element>
cudaError_t setup_decode() {
  return cudaFuncSetAttribute(decode_kernel<Element>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              kSmemBytes<Element>);
}

template <typename Element>
int max_active_clusters(int cluster_row_blocks) {
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = 1;
  attr.val.clusterDim.y = cluster_row_blocks;
  attr.val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(1, cluster_row_blocks);
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmemBytes<Element>;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, decode_kernel<Element>, &cfg) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

template <typename Element>
cudaError_t launch_decode(const DecodeParams& p, const CUtensorMap& q_map, const CUtensorMap& kv_map,
                          const CUtensorMap& kv_group_map, cudaStream_t stream) {
  const int m_blocks = num_row_blocks(p.rows);
  const dim3 grid = p.row_blocks_adjacent ? dim3(m_blocks, p.num_parts) : dim3(p.num_parts, m_blocks);
  cudaLaunchAttribute attrs[2];
  cudaLaunchConfig_t cfg = pdl_launch_config(grid, dim3(kThreads), kSmemBytes<Element>, stream, &attrs[0]);
  // Row blocks of one part read the same KV tiles: as a cluster they share each tile's loads by TMA
  // multicast, halving the L2 -> SM traffic for pairs.
  if (launches_cluster(p)) {
    attrs[1].id = cudaLaunchAttributeClusterDimension;
    attrs[1].val.clusterDim.x = 1;
    attrs[1].val.clusterDim.y = p.cluster_row_blocks;
    attrs[1].val.clusterDim.z = 1;
    cfg.attrs = attrs;
    cfg.numAttrs = 2;
  }
  return cudaLaunchKernelEx(&cfg, decode_kernel<Element>, p, q_map, kv_map, kv_group_map);
}

}  // namespace jax_mla::sm90
