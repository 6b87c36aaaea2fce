// See attn_sink.h. The out row is already rounded to its 16-bit dtype by the decode (or the
// combine); it is scaled in fp32 and rounded once more, so the sink costs at most one extra
// rounding of out against the CPU kernel, which scales its fp32 accumulator (2u instead of u).
#include "attn_sink.h"

#include <cmath>
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "config.h"
#include "launch.h"
#include "row_math.cuh"
#include "sparse_problem.h"

namespace jax_mla {
namespace {

constexpr int kThreads = 256;
constexpr int kRowsPerCta = kThreads / 32;  // one warp per row
constexpr int kWordsPerLane = kHeadDimV / 2 / 32;  // 8 words of two elements: 16 columns a lane
static_assert(kWordsPerLane == 8, "a lane's columns are two 16-byte vectors");

template <typename Element>
__global__ void __launch_bounds__(kThreads) attn_sink_kernel(Element* out, const float* lse, const float* attn_sink,
                                                              bool per_request, int64_t rows, int seq_q,
                                                              int heads_q) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerCta + warp;
  if (row >= rows) return;
  const float row_lse = lse[row];
  if (row_lse == -INFINITY) return;  // no counted slot: out stays 0 (NaN lse: out is NaN already)
  const int h = static_cast<int>(row % heads_q);
  const int r = static_cast<int>(row / heads_q / seq_q);
  const float factor = 1.f / attn_sink_divisor(attn_sink[sink_index(per_request, heads_q, r, h)], row_lse);
  // Lane l owns columns [16 l, 16 l + 16): two 16-byte vectors, a warp's loads one contiguous KB.
  uint4* v = reinterpret_cast<uint4*>(out + row * kHeadDimV) + 2 * lane;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    uint4 x = v[i];
    uint32_t* w = reinterpret_cast<uint32_t*>(&x);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = unpack2<Element>(w[j]);
      w[j] = pack2<Element>(f.x * factor, f.y * factor);
    }
    v[i] = x;
  }
}

}  // namespace

cudaError_t launch_attn_sink(DType dtype, void* out, const float* lse, const float* attn_sink, bool per_request,
                             int64_t rows, int seq_q, int heads_q, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  const int64_t ctas = (rows + kRowsPerCta - 1) / kRowsPerCta;
  if (ctas > INT32_MAX) return cudaErrorInvalidConfiguration;
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg =
      pdl_launch_config(dim3(static_cast<unsigned>(ctas)), dim3(kThreads), 0, stream, &attr, /*programmatic=*/false);
  if (dtype == DType::kBF16) {
    return cudaLaunchKernelEx(&cfg, attn_sink_kernel<__nv_bfloat16>, static_cast<__nv_bfloat16*>(out), lse,
                              attn_sink, per_request, rows, seq_q, heads_q);
  }
  return cudaLaunchKernelEx(&cfg, attn_sink_kernel<__half>, static_cast<__half*>(out), lse, attn_sink, per_request,
                            rows, seq_q, heads_q);
}

}  // namespace jax_mla
