// Epilogue of the SM90 consumers: normalise this consumer's half of O by the row sums and write
// either the final output (request computed by one part) or a split-KV partial for the combine.
#pragma once

#include <cmath>
#include <cstdint>

#include "../common/config.h"
#include "../common/params.h"
#include "../common/row_math.cuh"
#include "softmax.cuh"

namespace jax_mla::sm90 {

// o: (64, 256) fragment of columns [col0, col0 + 256). Writes rows < rows_valid.
// dst_row0 points at row 0 of this CTA's 64-row block: (rows, 512) elements of Element (final output)
// or float (partial).
template <typename Out>
__device__ __forceinline__ void store_o(const float (&o)[128], const RowResult& res, const RowCoords& rc,
                                        int rows_valid, int col0, Out* dst_row0) {
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (rc.row[i] >= rows_valid) continue;
    Out* dst = dst_row0 + static_cast<int64_t>(rc.row[i]) * kHeadDimV + col0 + rc.quad_col;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const float v0 = o[4 * j + 2 * i] * res.inv_sum[i];
      const float v1 = o[4 * j + 2 * i + 1] * res.inv_sum[i];
      if constexpr (std::is_same_v<Out, float>) {
        *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(v0, v1);
      } else {
        *reinterpret_cast<uint32_t*>(dst + 8 * j) = pack2<Out>(v0, v1);
      }
    }
  }
}

}  // namespace jax_mla::sm90
