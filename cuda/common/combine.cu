// Combine kernel: merges the split-KV partials of each request (see combine.h for the math).
// Grid (batch, ceil(rows / 8)), one warp per query row; each lane owns 16 of the 512 columns, so
// every partial row is read as one contiguous 2 KB burst per warp.
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
constexpr int kColsPerLane = kHeadDimV / 32;  // 16
static_assert(kColsPerLane % 4 == 0);

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
__device__ __forceinline__ void store_row(Element* dst, const float (&v)[kColsPerLane]) {
  uint32_t packed[kColsPerLane / 2];
#pragma unroll
  for (int k = 0; k < kColsPerLane / 2; ++k) {
    if constexpr (std::is_same_v<Element, __nv_bfloat16>) {
      __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);
      packed[k] = *reinterpret_cast<uint32_t*>(&h);
    } else {
      __half2 h = __floats2half2_rn(v[2 * k], v[2 * k + 1]);
      packed[k] = *reinterpret_cast<uint32_t*>(&h);
    }
  }
#pragma unroll
  for (int k = 0; k < kColsPerLane / 8; ++k) {
    reinterpret_cast<uint4*>(dst)[k] = make_uint4(packed[4 * k], packed[4 * k + 1], packed[4 * k + 2], packed[4 * k + 3]);
  }
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
  Element* dst = static_cast<Element*>(p.out) + out_row * kHeadDimV + lane * kColsPerLane;
  float acc[kColsPerLane];
#pragma unroll
  for (int k = 0; k < kColsPerLane; ++k) acc[k] = 0.f;

  if (n == 0) {  // no key at all; a negative length is an invalid request
    const bool bad = p.seq_lens[r] < 0;
    if (bad) {
#pragma unroll
      for (int k = 0; k < kColsPerLane; ++k) acc[k] = NAN;
    }
    store_row(dst, acc);
    if (lane == 0) p.lse[out_row] = bad ? NAN : -INFINITY;
    return;
  }

  // Pass 1: max and sum of exp over the splits' LSEs (lanes stride over splits).
  float m = -INFINITY;
  bool bad = false;
  for (int s = lane; s < n; s += 32) {
    const float v = p.partial_lse[static_cast<int64_t>(first + s) * p.rows + row];
    bad |= isnan(v);
    m = fmaxf(m, v);
  }
  m = warp_max(m);
  bad = __any_sync(0xffffffff, bad);
  float sum = 0.f;
  if (m != -INFINITY) {
    for (int s = lane; s < n; s += 32) sum += expf(p.partial_lse[static_cast<int64_t>(first + s) * p.rows + row] - m);
  }
  sum = warp_sum(sum);

  // Pass 2: weighted sum of the partial rows.
  if (m != -INFINITY) {
    const float inv = 1.f / sum;
    for (int s = 0; s < n; ++s) {
      const int64_t prow = static_cast<int64_t>(first + s) * p.rows + row;
      const float wgt = expf(p.partial_lse[prow] - m) * inv;
      const float4* src = reinterpret_cast<const float4*>(p.partial_out + prow * kHeadDimV + lane * kColsPerLane);
#pragma unroll
      for (int k = 0; k < kColsPerLane / 4; ++k) {
        const float4 v = src[k];
        acc[4 * k + 0] = fmaf(wgt, v.x, acc[4 * k + 0]);
        acc[4 * k + 1] = fmaf(wgt, v.y, acc[4 * k + 1]);
        acc[4 * k + 2] = fmaf(wgt, v.z, acc[4 * k + 2]);
        acc[4 * k + 3] = fmaf(wgt, v.w, acc[4 * k + 3]);
      }
    }
  }
  float lse = m == -INFINITY ? -INFINITY : m + logf(sum);
  if (bad) {
    lse = NAN;
#pragma unroll
    for (int k = 0; k < kColsPerLane; ++k) acc[k] = NAN;
  }
  store_row(dst, acc);
  if (lane == 0) p.lse[out_row] = lse;
}

}  // namespace

cudaError_t launch_combine(const DecodeParams& p, cudaStream_t stream) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(p.batch, (p.rows + kRowsPerCta - 1) / kRowsPerCta);
  cfg.blockDim = dim3(32 * kRowsPerCta);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  if (p.dtype == DType::kBF16) return cudaLaunchKernelEx(&cfg, combine_kernel<__nv_bfloat16>, p);
  return cudaLaunchKernelEx(&cfg, combine_kernel<__half>, p);
}

}  // namespace jax_mla
