// Host entry points of the SM90 decode kernel.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include "../common/params.h"

namespace jax_mla::sm90 {

// The in-kernel split merge (split_merge.cuh, p.fused_merge): the pieces of a request wait for each
// other, so every CTA of the grid must be resident at once (one decode CTA fills an SM: at most
// sm_count CTAs), and at most kFusedMergeMaxParts parts (a row's splits, one LSE per lane and
// register: 160 covers the 132 parts of one row block per SM on an H100 / H200).
inline constexpr int kFusedMergeMaxParts = 160;
inline bool fused_merge_fits(const DecodeParams& p) {
  const int64_t sms = p.sm_count > 0 ? p.sm_count : 132;
  return p.num_parts <= kFusedMergeMaxParts && static_cast<int64_t>(num_row_blocks(p.rows)) * p.num_parts <= sms;
}

// One-time per-device setup (opt-in shared memory); call from the FFI initialize stage.
template <typename Element>
cudaError_t setup_decode();

// Launches the decode kernel over grid (ceil(p.rows / 64), p.num_parts) with programmatic dependent
// launch. q_map: (b * rows, 576) box (64, 64); kv_map: (num_pages * page_size, 576)
// box (min(page_size, 64), 64); kv_group_map: the cache's column-box view with box (64, 64, 3) for
// pages of >= 64 tokens (kv_producer.cuh kBoxesPerGroup), else unused.
template <typename Element>
cudaError_t launch_decode(const DecodeParams& p, const CUtensorMap& q_map, const CUtensorMap& kv_map,
                          const CUtensorMap& kv_group_map, cudaStream_t stream);

}  // namespace jax_mla::sm90
