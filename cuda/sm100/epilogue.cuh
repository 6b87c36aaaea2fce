// SM100 epilogue (run by the correction warpgroup once a piece's last P V completed): O from TMEM,
// normalised by the row sum, written as the final output (request computed by one part) or as a
// split-KV partial (O normalised by this part's own sum, plus its LSE) for the shared combine kernel.
// Same semantics as cuda/sm90/epilogue.cuh: rows with no visible key get O = 0 and LSE = -inf, a
// request with a bad block-table entry NaN.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "../common/config.h"
#include "config.h"
#include "softmax.cuh"
#include "tcgen05.cuh"

namespace jax_mla::sm100 {

struct RowResult {
  float inv_sum;  // 1 / row sum, 0 for a row that saw no key, NaN for a bad request
  float lse;      // natural log-sum-exp, -inf for a row that saw no key, NaN for a bad request
};

// m: the reference max (log2 units) the row's exponentials were taken against; sum: the full row sum.
__device__ __forceinline__ RowResult finish_row(float m, float sum, bool bad) {
  const bool empty = sum == 0.f;  // NaN data stays NaN
  RowResult res;
  res.inv_sum = bad ? NAN : (empty ? 0.f : 1.f / sum);
  res.lse = bad ? NAN : (empty ? -INFINITY : (m + log2f(sum)) * 0.69314718055994531f);
  return res;
}

// Thread (quarter q, lane l) of the correction warpgroup owns row 32 (q % 2) + l and, in each O half h,
// columns 256 h + 128 (q / 2) .. + 127: TMEM lanes 32 q .., columns kTmemColO + 128 h .. (config.h).
// Reads them 32 columns at a time and stores row `row` of dst_row0 (a (rows, 512) block of Out) when
// row < rows_valid. Every lane executes the TMEM loads (warp-collective).
template <typename Out>
__device__ __forceinline__ void store_o(uint32_t tmem, uint32_t lane_base, int row, int col_quarter, int rows_valid,
                                        float inv_sum, Out* dst_row0) {
  Out* dst = dst_row0 + static_cast<int64_t>(row) * kHeadDimV;
#pragma unroll 1
  for (int h = 0; h < kPvHalves; ++h) {
#pragma unroll 1
    for (int j = 0; j < kPvN / 2 / 32; ++j) {
      uint32_t v[32];
      tc::ld_32x32b_x32_sync(tmem_addr(tmem, lane_base, kTmemColO + h * (kPvN / 2) + 32 * j), v);
      if (row < rows_valid) {  // stores only: the loads above are warp-collective
        Out* d = dst + h * kPvN + col_quarter * (kPvN / 2) + 32 * j;
        if constexpr (std::is_same_v<Out, float>) {
#pragma unroll
          for (int k = 0; k < 32; k += 4) {
            *reinterpret_cast<float4*>(d + k) =
                make_float4(__uint_as_float(v[k]) * inv_sum, __uint_as_float(v[k + 1]) * inv_sum,
                            __uint_as_float(v[k + 2]) * inv_sum, __uint_as_float(v[k + 3]) * inv_sum);
          }
        } else {
#pragma unroll
          for (int k = 0; k < 32; k += 8) {
            uint4 u;
            u.x = pack2<Out>(__uint_as_float(v[k + 0]) * inv_sum, __uint_as_float(v[k + 1]) * inv_sum);
            u.y = pack2<Out>(__uint_as_float(v[k + 2]) * inv_sum, __uint_as_float(v[k + 3]) * inv_sum);
            u.z = pack2<Out>(__uint_as_float(v[k + 4]) * inv_sum, __uint_as_float(v[k + 5]) * inv_sum);
            u.w = pack2<Out>(__uint_as_float(v[k + 6]) * inv_sum, __uint_as_float(v[k + 7]) * inv_sum);
            *reinterpret_cast<uint4*>(d + k) = u;
          }
        }
      }
    }
  }
}

}  // namespace jax_mla::sm100
