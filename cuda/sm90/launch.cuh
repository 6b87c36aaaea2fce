// Definitions behind launch.h, included once per element type by instantiations/*.cu.
#pragma once

#include "decode_kernel.cuh"
#include "transposed_kernel.cuh"
#include "../common/launch.h"
#include "launch.h"

namespace jax_mla::sm90 {

static_assert(NarrowShape::kQRows == kNarrowMaxRows, "launch.h's narrow row limit is the narrow shape's Q rows");
static_assert(TransposedShape::kQRows == kNarrowMaxRows, "launch.h's row limit is the transposed shape's Q rows");

template <typename Element, typename Shape, bool kSplit = false>
cudaError_t set_max_smem() {
  return cudaFuncSetAttribute(decode_kernel<Element, Shape, kSplit>, cudaFuncAttributeMaxDynamicSharedMemorySize,
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
  if (e == cudaSuccess) e = set_max_smem<Element, WideShape, true>();
  if (e == cudaSuccess) e = set_max_smem<Element, NarrowShape>();
  if (e == cudaSuccess) e = set_max_smem_t<Element, false, false>();
  if (e == cudaSuccess) e = set_max_smem_t<Element, true, false>();
  if (e == cudaSuccess) e = set_max_smem_t<Element, true, true>();
  return e;
}

// The launch attribute for thread-block clusters of `dims` CTAs.
inline cudaLaunchAttribute cluster_dim_attr(dim3 dims) {
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = dims.x;
  attr.val.clusterDim.y = dims.y;
  attr.val.clusterDim.z = dims.z;
  return attr;
}

// How many clusters of `dims` wide-shape CTAs (one per SM) the device runs at once; 0 when the
// query fails.
template <typename Element, bool kSplit>
int resident_clusters(dim3 dims) {
  cudaLaunchAttribute attr = cluster_dim_attr(dims);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dims;
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = kSmemBytes<Element, WideShape>;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, decode_kernel<Element, WideShape, kSplit>, &cfg) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

template <typename Element>
int max_active_clusters(int cluster_row_blocks) {
  return resident_clusters<Element, false>(dim3(1, cluster_row_blocks));
}

// Split parts: the cluster lies along the grid's y (row_blocks_adjacent) or x dimension.
template <typename Element>
int max_active_split_clusters(int split, bool row_blocks_adjacent) {
  return resident_clusters<Element, true>(row_blocks_adjacent ? dim3(1, split) : dim3(split, 1));
}

template <typename Element, typename Shape>
cudaError_t launch_shape(const DecodeParams& p, const CUtensorMap& q_map, const CUtensorMap& kv_map,
                         const CUtensorMap& kv_group_map, cudaStream_t stream) {
  const int m_blocks = (p.rows + kBlockM - 1) / kBlockM;
  // Split parts (split_combine.cuh): k CTAs per part and row block, one cluster along the parts
  // dimension. The narrow shape never splits.
  const int split = Shape::kNarrow ? 1 : p.sm90_split_ctas;
  const unsigned parts = static_cast<unsigned>(p.num_parts * split);
  const dim3 grid = p.row_blocks_adjacent ? dim3(m_blocks, parts) : dim3(parts, m_blocks);
  cudaLaunchAttribute attrs[2];
  cudaLaunchConfig_t cfg = pdl_launch_config(grid, dim3(kThreads), kSmemBytes<Element, Shape>, stream, &attrs[0]);
  if (split > 1) {
    attrs[1] = cluster_dim_attr(p.row_blocks_adjacent ? dim3(1, split) : dim3(split, 1));
    cfg.attrs = attrs;
    cfg.numAttrs = 2;
  } else if (!p.row_blocks_adjacent && p.cluster_row_blocks > 1 && m_blocks % p.cluster_row_blocks == 0) {
    // Row blocks of one part read the same KV tiles: as a cluster they share each tile's loads by TMA
    // multicast, halving the L2 -> SM traffic for pairs.
    attrs[1] = cluster_dim_attr(dim3(1, p.cluster_row_blocks));
    cfg.attrs = attrs;
    cfg.numAttrs = 2;
  }
  if constexpr (!Shape::kNarrow) {
    if (split > 1) return cudaLaunchKernelEx(&cfg, decode_kernel<Element, Shape, true>, p, q_map, kv_map, kv_group_map);
  }
  return cudaLaunchKernelEx(&cfg, decode_kernel<Element, Shape, false>, p, q_map, kv_map, kv_group_map);
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
cudaError_t launch_decode(const DecodeParams& params, const CUtensorMap& q_map, const CUtensorMap& kv_map,
                          const CUtensorMap& kv_group_map, cudaStream_t stream) {
  // Only the wide shape runs split parts; the others take one CTA per part (CtaWork reads the field).
  DecodeParams p = params;
  if (uses_transposed_shape(p) || uses_narrow_shape(p)) p.sm90_split_ctas = 1;
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
