// See sparse_table.h. A stream compaction per query token that keeps the order: the CTA walks the
// token's counted indices kThreads at a time; each warp ballots which of its 32 indices stay, the
// warps' counts go through shared memory, and every kept index lands at (kept before it in earlier
// rounds) + (kept by earlier warps of this round) + (kept by earlier lanes of its warp).
#include "sparse_table.h"

#include <cstdint>

#include "launch.h"
#include "sparse_problem.h"

namespace jax_mla {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__global__ void __launch_bounds__(kThreads) sparse_table_kernel(const int32_t* indices, const int32_t* topk_length,
                                                                 int seq_q, int topk, int32_t* table,
                                                                 int32_t* lengths) {
  __shared__ int warp_kept[kWarps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t query = blockIdx.x;  // r * seq_q + t
  const int n = counted_indices(topk_length, static_cast<int>(query / seq_q), topk);  // uniform over the CTA
  const int32_t* src = indices + query * topk;  // (topk)
  int32_t* dst = table + query * topk;          // (topk)
  const unsigned lanes_below = (1u << lane) - 1u;
  int kept = 0;  // indices written so far
  for (int64_t k0 = 0; k0 < n; k0 += kThreads) {  // int64: no overflow for topk near INT32_MAX
    const int64_t k = k0 + threadIdx.x;
    const int32_t slot = k < n ? src[k] : -1;
    const bool keep = slot != -1;
    const unsigned ballot = __ballot_sync(0xffffffffu, keep);
    if (lane == 0) warp_kept[warp] = __popc(ballot);
    __syncthreads();
    int before = 0, round = 0;  // kept by earlier warps of this round; by all warps
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const int c = warp_kept[w];
      before += w < warp ? c : 0;
      round += c;
    }
    if (keep) dst[kept + before + __popc(ballot & lanes_below)] = slot;
    kept += round;
    __syncthreads();  // warp_kept is rewritten by the next round
  }
  if (threadIdx.x == 0) lengths[query] = kept;
}

}  // namespace

cudaError_t launch_sparse_table(const int32_t* indices, const int32_t* topk_length, int queries, int seq_q, int topk,
                                int32_t* table, int32_t* lengths, cudaStream_t stream) {
  if (queries <= 0) return cudaSuccess;
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg =
      pdl_launch_config(dim3(static_cast<unsigned>(queries)), dim3(kThreads), 0, stream, &attr, /*programmatic=*/false);
  return cudaLaunchKernelEx(&cfg, sparse_table_kernel, indices, topk_length, seq_q, topk, table, lengths);
}

}  // namespace jax_mla
