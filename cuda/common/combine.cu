// Combine kernel: merges the split-KV partials of the requests the schedule lists (scheduler.h:
// the requests with num_splits != 1), with the arithmetic of lse_merge.h.
//
// Cost: every partial row is read once (rows * 512 fp32 per split: 256 KB per split at 128 rows)
// and every listed output row written once, so the kernel is bandwidth work whose loads must all
// be in flight early: a DRAM round trip is about 1 us, so each SM needs some 32-48 KB in flight to
// run near the H200's 4.3 TB/s. Work is therefore sized to what the schedule lists (read on the
// device, after griddepcontrol.wait), not to the batch, and walked by a persistent grid sized on
// the host from b, num_parts, rows and the SM count (no host sync; CUDA-graph safe).
//
// Work items, in this order (the longest first):
//  - many-split requests (num_splits > kManySplits, listed first): item = (request, row, 128-column
//    quarter), one CTA. Warp g takes splits g, g + 8, g + 16, ..., each lane one float4 of each;
//    up to kManyUnroll splits per warp are loaded at once (num_splits <= 128 in one round), then
//    the 8 warps' sums are added through shared memory in warp order. b = 1 at 32K (65 splits of
//    128 rows): 512 items, ~8 independent 16-byte loads per lane in flight.
//  - the other listed requests (0 or 2 .. kManySplits splits): item = (request, row), one warp.
//    Lane l owns the float4s at columns 4l + 128k (k < 4), up to kFewUnroll splits are loaded at
//    once: 16 independent 16-byte loads per lane. A CTA step takes 8 consecutive items.
// In both, the first round of partial loads is issued before the LSE reduction, so one memory
// latency covers both. Every sum has a fixed order (no atomics): results are bit-identical across
// runs. NaN semantics as lse_merge.h: a NaN partial LSE makes the row NaN; a row whose splits are
// all -inf gets O = 0, lse = -inf; a request with no split gets 0 / -inf, or NaN when its length
// is negative (invalid).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "config.h"
#include "launch.h"
#include "lse_merge.h"
#include "problem.h"
#include "ptx.cuh"
#include "row_math.cuh"
#include "scheduler.h"

namespace jax_mla {
namespace {

constexpr int kCombineThreads = 256;
constexpr int kCombineWarps = kCombineThreads / 32;  // 8
// Two CTAs per SM (<= 128 registers a thread): 16 warps, each with 8-16 KB of loads in flight.
constexpr int kCombineCtasPerSm = 2;
constexpr int kFloat4PerRow = kHeadDimV / 4;  // 128

// Many-split items: (request, row, quarter), one float4 per lane.
constexpr int kQuarters = 4;
constexpr int kQuarterFloat4 = kFloat4PerRow / kQuarters;
static_assert(kQuarterFloat4 == 32, "one float4 of a quarter per lane");
constexpr int kManyUnroll = 16;  // splits a warp loads per round

// Few-split items: (request, row), four float4 per lane.
constexpr int kRowFloat4PerLane = kFloat4PerRow / 32;  // 4
constexpr int kFewUnroll = 4;                          // 4 x 4 float4 loads in flight per lane
static_assert(kRowFloat4PerLane * 32 == kFloat4PerRow);
static_assert(kManySplits <= 2 * kFewUnroll, "a few-split row takes at most two rounds of loads");

__device__ __forceinline__ void fma4(float4& acc, float w, const float4& v) {
  acc.x = fmaf(w, v.x, acc.x);
  acc.y = fmaf(w, v.y, acc.y);
  acc.z = fmaf(w, v.z, acc.z);
  acc.w = fmaf(w, v.w, acc.w);
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

// One entry of the combine list with its slots.
struct ListedRequest {
  int request;     // -1 when the entry names no request of this batch (not a plan for it)
  int first_slot;  // workspace slot of split 0
  int num_splits;  // 0 (no key) or >= 2 in a plan
};

__device__ __forceinline__ ListedRequest listed_request(const DecodeProblem& p, const int32_t* list,
                                                        const int32_t* split_offsets, int64_t i) {
  ListedRequest l;
  l.request = list[i];
  l.first_slot = 0;
  l.num_splits = 0;
  if (l.request < 0 || l.request >= p.batch) {
    l.request = -1;
    return l;
  }
  l.first_slot = split_offsets[l.request];
  l.num_splits = split_offsets[l.request + 1] - l.first_slot;
  return l;
}

// RowWeights (lse_merge.h) of one row over its n split LSEs (lse_col: stride rows), any n: the
// lanes stride over the splits, reading them from memory twice (the second pass only when some
// split saw a key).
__device__ __forceinline__ RowWeights warp_row_weights(const float* lse_col, int64_t rows, int n) {
  const int lane = threadIdx.x % 32;
  RowWeights r;
  r.m = -INFINITY;
  r.bad = false;
  for (int s = lane; s < n; s += 32) include_lse(r, lse_col[s * rows]);
  r.m = warp_max(r.m);
  r.bad = __any_sync(0xffffffff, r.bad);
  r.sum = 0.f;
  if (r.m != -INFINITY) {
    for (int s = lane; s < n; s += 32) r.sum += lse_weight(lse_col[s * rows], r.m);
  }
  r.sum = warp_sum(r.sum);
  r.inv = inv_weight_sum(r.m, r.sum);
  return r;
}

// Value of every output element of a request with no split (seq_len <= 0): 0, NaN when invalid.
__device__ __forceinline__ bool invalid_length(const DecodeProblem& p, int r) { return p.seq_lens[r] < 0; }

// ---- few-split rows: one warp per (request, row) --------------------------------------------------

// Loads the partial float4s of splits [base, base + kFewUnroll) (those < n) of this lane's columns.
__device__ __forceinline__ void load_few_round(const float* src, int64_t split_stride, int base, int n,
                                               float4 (&v)[kFewUnroll][kRowFloat4PerLane]) {
#pragma unroll
  for (int j = 0; j < kFewUnroll; ++j) {
#pragma unroll
    for (int k = 0; k < kRowFloat4PerLane; ++k) {
      v[j][k] = base + j < n ? *reinterpret_cast<const float4*>(src + (base + j) * split_stride + k * 128)
                             : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
}

template <typename Element>
__device__ void combine_few_row(const DecodeProblem& p, const ListedRequest& req, int row) {
  const int lane = threadIdx.x % 32;
  const int n = req.num_splits;
  if (req.request < 0 || n == 1) return;  // not a listed request of this plan
  const int64_t rows = p.rows;
  const int64_t out_row = static_cast<int64_t>(req.request) * rows + row;
  Element* dst = static_cast<Element*>(p.out) + out_row * kHeadDimV + lane * 4;  // + 128 k
  if (n == 0) {
    const bool bad = invalid_length(p, req.request);
    const float x = bad ? NAN : 0.f;
#pragma unroll
    for (int k = 0; k < kRowFloat4PerLane; ++k) store4(dst + k * 128, make_float4(x, x, x, x));
    if (lane == 0) p.lse[out_row] = bad ? NAN : -INFINITY;
    return;
  }
  const float* lse_col = p.partial_lse + static_cast<int64_t>(req.first_slot) * rows + row;  // stride rows
  // partial_out (slots, rows, 512): this row of split s at src + s * split_stride.
  const float* src = p.partial_out + (static_cast<int64_t>(req.first_slot) * rows + row) * kHeadDimV + lane * 4;
  const int64_t split_stride = rows * kHeadDimV;

  float4 v[kFewUnroll][kRowFloat4PerLane];  // (splits of a round, float4s of the lane)
  load_few_round(src, split_stride, 0, n, v);
  const RowWeights wt = warp_row_weights(lse_col, rows, n);

  float4 acc[kRowFloat4PerLane];
#pragma unroll
  for (int k = 0; k < kRowFloat4PerLane; ++k) acc[k] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int base = 0; base < n; base += kFewUnroll) {
    if (base > 0) load_few_round(src, split_stride, base, n, v);
#pragma unroll
    for (int j = 0; j < kFewUnroll; ++j) {
      if (base + j < n) {
        const float w = split_weight(wt, lse_col[(base + j) * rows]);  // every lane: one broadcast load
#pragma unroll
        for (int k = 0; k < kRowFloat4PerLane; ++k) fma4(acc[k], w, v[j][k]);
      }
    }
  }
#pragma unroll
  for (int k = 0; k < kRowFloat4PerLane; ++k) {
    store4(dst + k * 128, wt.bad ? make_float4(NAN, NAN, NAN, NAN) : acc[k]);
  }
  if (lane == 0) p.lse[out_row] = merged_lse(wt);
}

// ---- many-split rows: one CTA per (request, row, quarter) -----------------------------------------

// Loads split base + 8 j (j < kManyUnroll, those < n) of this lane's float4.
__device__ __forceinline__ void load_many_round(const float* src, int64_t split_stride, int base, int n,
                                                float4 (&v)[kManyUnroll]) {
#pragma unroll
  for (int j = 0; j < kManyUnroll; ++j) {
    const int s = base + j * kCombineWarps;
    v[j] = s < n ? *reinterpret_cast<const float4*>(src + s * split_stride) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

// req is the same in every thread of the CTA (one list entry), so the barrier is uniform.
// reduce: (kCombineWarps, 32) float4 in shared memory that nobody reads after the CTA's previous
// barrier (the caller alternates two buffers). Returns whether it used reduce (and the barrier):
// only then may the caller switch buffers.
template <typename Element>
__device__ bool combine_many_slice(const DecodeProblem& p, const ListedRequest& req, int row, int quarter,
                                   float4 (*reduce)[32]) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int n = req.num_splits;
  if (req.request < 0 || n == 1) return false;
  const int64_t rows = p.rows;
  const int64_t out_row = static_cast<int64_t>(req.request) * rows + row;
  const int col = quarter * (kQuarterFloat4 * 4) + lane * 4;
  Element* dst = static_cast<Element*>(p.out) + out_row * kHeadDimV + col;
  const bool writes_lse = quarter == 0 && warp == 0 && lane == 0;
  if (n == 0) {  // not in a plan's many-split class, but keep the meaning of the list
    if (warp == 0) {
      const bool bad = invalid_length(p, req.request);
      const float x = bad ? NAN : 0.f;
      store4(dst, make_float4(x, x, x, x));
      if (writes_lse) p.lse[out_row] = bad ? NAN : -INFINITY;
    }
    return false;
  }
  const float* lse_col = p.partial_lse + static_cast<int64_t>(req.first_slot) * rows + row;  // stride rows
  const float* src = p.partial_out + (static_cast<int64_t>(req.first_slot) * rows + row) * kHeadDimV + col;
  const int64_t split_stride = rows * kHeadDimV;

  float4 v[kManyUnroll];  // (splits of a round) this lane's float4 of splits warp + 8 j
  load_many_round(src, split_stride, warp, n, v);
  const RowWeights wt = warp_row_weights(lse_col, rows, n);  // every warp over all n (L1 hits after the first)

  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int base = warp; base < n; base += kCombineWarps * kManyUnroll) {
    if (base != warp) load_many_round(src, split_stride, base, n, v);
#pragma unroll
    for (int j = 0; j < kManyUnroll; ++j) {
      const int s = base + j * kCombineWarps;
      if (s < n) fma4(acc, split_weight(wt, lse_col[s * rows]), v[j]);
    }
  }
  reduce[warp][lane] = acc;
  __syncthreads();
  if (warp == 0) {
    float4 total = reduce[0][lane];
#pragma unroll
    for (int g = 1; g < kCombineWarps; ++g) {  // fixed order: bit-identical across runs
      const float4 x = reduce[g][lane];
      total.x += x.x;
      total.y += x.y;
      total.z += x.z;
      total.w += x.w;
    }
    store4(dst, wt.bad ? make_float4(NAN, NAN, NAN, NAN) : total);
    if (writes_lse) p.lse[out_row] = merged_lse(wt);
  }
  return true;
}

template <typename Element>
__global__ void __launch_bounds__(kCombineThreads, kCombineCtasPerSm) combine_kernel(const __grid_constant__ DecodeProblem p) {
  __shared__ float4 reduce[2][kCombineWarps][32];  // many-split warp sums, double-buffered
  ptx::grid_dependency_wait();  // the partials (and a schedule made in-op) come from earlier kernels

  const int32_t* split_offsets = p.schedule + split_offsets_begin(p.num_parts);  // (b + 1)
  const int32_t* combine = p.schedule + combine_begin(p.batch, p.num_parts);     // (kCombineHeader + b)
  const int32_t* list = combine + kCombineHeader;                                // (b)
  // Clamped so that an array that is not a plan cannot send the loop outside the list.
  const int num_listed = min(max(combine[kCombineCount], 0), p.batch);
  const int num_many = min(max(combine[kCombineManyCount], 0), num_listed);
  const int64_t rows = p.rows;
  const int64_t many_items = static_cast<int64_t>(num_many) * rows * kQuarters;  // (request, row, quarter)
  const int64_t few_rows = static_cast<int64_t>(num_listed - num_many) * rows;   // (request, row)
  const int64_t items = many_items + (few_rows + kCombineWarps - 1) / kCombineWarps;
  const int warp = threadIdx.x / 32;

  int parity = 0;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    if (item < many_items) {  // uniform over the CTA
      const int quarter = static_cast<int>(item % kQuarters);
      const int64_t request_row = item / kQuarters;
      const ListedRequest req = listed_request(p, list, split_offsets, request_row / rows);
      if (combine_many_slice<Element>(p, req, static_cast<int>(request_row % rows), quarter, reduce[parity])) {
        parity ^= 1;
      }
    } else {
      const int64_t u = (item - many_items) * kCombineWarps + warp;
      if (u < few_rows) {
        const ListedRequest req = listed_request(p, list, split_offsets, num_many + u / rows);
        combine_few_row<Element>(p, req, static_cast<int>(u % rows));
      }
    }
  }
}

// CTAs worth launching: no more than the items any plan of this shape can list, no more than
// fit on the GPU at once. A request with n pieces spans n consecutive parts and requests share at
// most their boundary parts, so sum(n - 1) <= num_parts - 1: at most (num_parts - 1) / kManySplits
// requests are many-split, and at most b are listed.
int64_t combine_grid(const DecodeProblem& p, int sm_count) {
  const int64_t b = p.batch, rows = p.rows;
  const int64_t many = std::min<int64_t>(b, (static_cast<int64_t>(p.num_parts) - 1) / kManySplits);
  const int64_t items = many * rows * kQuarters + (b * rows + kCombineWarps - 1) / kCombineWarps;
  const int64_t resident = static_cast<int64_t>(sm_count > 0 ? sm_count : 132) * kCombineCtasPerSm;
  return std::max<int64_t>(1, std::min(items, resident));
}

}  // namespace

cudaError_t launch_combine(const DecodeProblem& p, int sm_count, bool programmatic, cudaStream_t stream) {
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = pdl_launch_config(dim3(static_cast<unsigned>(combine_grid(p, sm_count))),
                                                   dim3(kCombineThreads), 0, stream, &attr, programmatic);
  if (p.dtype == DType::kBF16) return cudaLaunchKernelEx(&cfg, combine_kernel<__nv_bfloat16>, p);
  return cudaLaunchKernelEx(&cfg, combine_kernel<__half>, p);
}

}  // namespace jax_mla
