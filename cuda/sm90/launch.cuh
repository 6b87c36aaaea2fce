// Definitions behind launch.h, included once per element type by instantiations/*.cu.
#pragma once

#include "decode_kernel.cuh"
#include "transposed_kernel.cuh"
#include "../common/launch.h"
#include "launch.h"

namespace jax_mla::sm90 {

static_assert(NarrowShape::kQRows == kNarrowMaxRows, "launch.h's narrow row limit is the narrow shape's Q rows");
static_assert(TransposedShape::kQRows == kNarrowMaxRows, "launch.h's row limit is the transposed shape's Q rows");

template <typename Element, typename Shape>
cudaError_t set_max_smem() {
  return cudaFuncSetAttribute(decode_kernel<Element, Shape>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              kSmemBytes<Element, Shape>);
}

// The transposed kernel's variants (transposed_kernel.cuh): <kPipelined, kSplitK>.
template <typename Element, bool kPipelined, bool kSplitK>
cudaError_t set_max_smem_t() {
  return cudaFuncSetAttribute(decode_kernel_t<Element, kPipelined, kSplitK>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytesT<Element, kSplitK>);
}

template <typename Element>
cudaError_t setup_decode() {
  cudaError_t e = set_max_smem<Element, WideShape>();
  if (e == cudaSuccess) e = set_max_smem<Element, NarrowShape>();
  if (e == cudaSuccess) e = set_max_smem_t<Element, false, false>();
  if (e == cudaSuccess) e = set_max_smem_t<Element, true, false>();
  if (e == cudaSuccess) e = set_max_smem_t<Element, true, true>();
  return e;
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
  cfg.dynamicSmemBytes = kSmemBytes<Element, WideShape>;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, decode_kernel<Element, WideShape>, &cfg) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

template <typename Element, typename Shape>
cudaError_t launch_shape(const DecodeParams& p, const CUtensorMap& q_map, const CUtensorMap& kv_map,
                         const CUtensorMap& kv_group_map, cudaStream_t stream) {
  const int m_blocks = num_row_blocks(p.rows);
  const dim3 grid = p.row_blocks_adjacent ? dim3(m_blocks, p.num_parts) : dim3(p.num_parts, m_blocks);
  cudaLaunchAttribute attrs[2];
  cudaLaunchConfig_t cfg = pdl_launch_config(grid, dim3(kThreads), kSmemBytes<Element, Shape>, stream, &attrs[0]);
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
  return cudaLaunchKernelEx(&cfg, decode_kernel<Element, Shape>, p, q_map, kv_map, kv_group_map);
}

// A transposed variant: requests of at most 16 rows (uses_transposed_shape), so one row block, no
// cluster: grid (1, parts) or (parts, 1) as p.row_blocks_adjacent says (CtaWork reads it either way).
template <typename Element, bool kPipelined, bool kSplitK>
cudaError_t launch_t(const DecodeParams& p, const CUtensorMap& q_map, const CUtensorMap& kv_map,
                     const CUtensorMap& kv_group_map, cudaStream_t stream) {
  const unsigned parts = static_cast<unsigned>(p.num_parts);
  const dim3 grid = p.row_blocks_adjacent ? dim3(1, parts) : dim3(parts, 1);
  cudaLaunchAttribute attr;
  cudaLaunchConfig_t cfg = pdl_launch_config(grid, dim3(kThreads), kSmemBytesT<Element, kSplitK>, stream, &attr);
  return cudaLaunchKernelEx(&cfg, decode_kernel_t<Element, kPipelined, kSplitK>, p, q_map, kv_map, kv_group_map);
}

template <typename Element>
cudaError_t launch_decode(const DecodeParams& p, const CUtensorMap& q_map, const CUtensorMap& kv_map,
                          const CUtensorMap& kv_group_map, cudaStream_t stream) {
  if (uses_transposed_shape(p)) {
    switch (p.sm90_small_rows) {
      case Sm90SmallRows::kTransposedPipelined:
        return launch_t<Element, true, false>(p, q_map, kv_map, kv_group_map, stream);
      case Sm90SmallRows::kTransposedSplitK:
        return launch_t<Element, true, true>(p, q_map, kv_map, kv_group_map, stream);
      default:
        return launch_t<Element, false, false>(p, q_map, kv_map, kv_group_map, stream);
    }
  }
  return uses_narrow_shape(p) ? launch_shape<Element, NarrowShape>(p, q_map, kv_map, kv_group_map, stream)
                              : launch_shape<Element, WideShape>(p, q_map, kv_map, kv_group_map, stream);
}

}  // namespace jax_mla::sm90
