// Combine kernel: merges the split-KV partials of each request (see combine.h for the math).
// Grid (batch, ceil(rows / 8), 4): one warp per (query row, 128-column quarter), each lane one
// float4 of every partial row, so a warp reads 512 contiguous bytes per split; the loop over
// splits is unrolled so that several splits' loads are in flight at once (a request with one
// long sequence can have ~100 splits, and one dependent load after another was the bottleneck).
#include <cmath>
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "config.h"
#include "launch.h"
#include "params.h"
#include "ptx.cuh"
#include "scheduler.h"

namespace jax_mla {
namespace {

constexpr int kRowsPerCta = 8;
constexpr int kColSlices = 4;                               // blockIdx.z
constexpr int kColsPerWarp = kHeadDimV / kColSlices;        // 128
constexpr int kColsPerLane = kColsPerWarp / 32;             // 4: one float4
static_assert(kColsPerLane == 4);

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, d));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) x += __shfl_xor_sync(0xffffffff, x, d);
  return x;
}

template <typename Element>
__device__ __forceinline__ void store4(Element* dst, float4 v) {
  uint32_t lo, hi;
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
    __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
    lo = *reinterpret_cast<uint32_t*>(&a);
    hi = *reinterpret_cast<uint32_t*>(&b);
  } else {
    __half2 a = __floats2half2_rn(v.x, v.y), b = __floats2half2_rn(v.z, v.w);
    lo = *reinterpret_cast<uint32_t*>(&a);
    hi = *reinterpret_cast<uint32_t*>(&b);
  }
  *reinterpret_cast<uint2*>(dst) = make_uint2(lo, hi);
}

template <typename Element>
__global__ void __launch_bounds__(32 * kRowsPerCta) combine_kernel(const __grid_constant__ DecodeParams p) {
  ptx::grid_dependency_wait();  // partials come from the decode kernel
  const int r = blockIdx.x;
  const int row = blockIdx.y * kRowsPerCta + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= p.rows) return;
  const int32_t* split_offsets = p.schedule + static_cast<int64_t>(p.num_parts) * kPartFields;
  const int first = split_offsets[r];
  const int n = split_offsets[r + 1] - first;
  if (n == 1) return;  // the decode kernel wrote this request directly

  const int64_t out_row = static_cast<int64_t>(r) * p.rows + row;
  const int col = blockIdx.z * kColsPerWarp + lane * kColsPerLane;
  Element* dst = static_cast<Element*>(p.out) + out_row * kHeadDimV + col;
  const bool writes_lse = blockIdx.z == 0 && lane == 0;

  if (n == 0) {  // no key at all; a negative length is an invalid request
    const bool bad = p.seq_lens[r] < 0;
    const float v = bad ? NAN : 0.f;
    store4(dst, make_float4(v, v, v, v));
    if (writes_lse) p.lse[out_row] = bad ? NAN : -INFINITY;
    return;
  }

  // Max and sum of exp over the splits' LSEs (lanes stride over splits). NaN (a bad request or NaN
  // data) must survive: fmaxf would drop it, so it is tracked apart.
  const float* lse_col = p.partial_lse + static_cast<int64_t>(first) * p.rows + row;  // stride p.rows
  float m = -INFINITY;
  bool bad = false;
  for (int s = lane; s < n; s += 32) {
    const float v = lse_col[static_cast<int64_t>(s) * p.rows];
    bad |= isnan(v);
    m = fmaxf(m, v);
  }
  m = warp_max(m);
  bad = __any_sync(0xffffffff, bad);
  float sum = 0.f;
  if (m != -INFINITY) {
    for (int s = lane; s < n; s += 32) sum += expf(lse_col[static_cast<int64_t>(s) * p.rows] - m);
  }
  sum = warp_sum(sum);
  const float inv = m == -INFINITY ? 0.f : 1.f / sum;

  // Weighted sum of the partial rows, 32 splits at a time: lane j holds split (base + j)'s weight.
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  const float* src = p.partial_out + (static_cast<int64_t>(first) * p.rows + row) * kHeadDimV + col;
  const int64_t split_stride = static_cast<int64_t>(p.rows) * kHeadDimV;
  for (int base = 0; base < n; base += 32) {
    const int s_lane = base + lane;
    const float w_lane = (s_lane < n && m != -INFINITY) ? expf(lse_col[static_cast<int64_t>(s_lane) * p.rows] - m) * inv : 0.f;
    const int count = min(32, n - base);
#pragma unroll 8
    for (int j = 0; j < count; ++j) {
      const float w = __shfl_sync(0xffffffff, w_lane, j);
      const float4 v = *reinterpret_cast<const float4*>(src + (base + j) * split_stride);
      acc.x = fmaf(w, v.x, acc.x);
      acc.y = fmaf(w, v.y, acc.y);
      acc.z = fmaf(w, v.z, acc.z);
      acc.w = fmaf(w, v.w, acc.w);
    }
  }
  float lse = m == -INFINITY ? -INFINITY : m + logf(sum);
  if (bad) {
    lse = NAN;
    acc = make_float4(NAN, NAN, NAN, NAN);
  }
  store4(dst, acc);
  if (writes_lse) p.lse[out_row] = lse;
}

}  // namespace

cudaError_t launch_combine(const DecodeParams& p, bool programmatic, cudaStream_t stream) {
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg =
      pdl_launch_config(dim3(p.batch, (p.rows + kRowsPerCta - 1) / kRowsPerCta, kColSlices), dim3(32 * kRowsPerCta), 0,
                        stream, &attr, programmatic);
  if (p.dtype == DType::kBF16) return cudaLaunchKernelEx(&cfg, combine_kernel<__nv_bfloat16>, p);
  return cudaLaunchKernelEx(&cfg, combine_kernel<__half>, p);
}

}  // namespace jax_mla
