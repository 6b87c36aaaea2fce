// Online softmax of the portable consumers, on the full scores of 16 rows x 32 keys (ScoreTile,
// identical in the 4 warps of a row group). Thread (g, t) holds rows g and g + 8, keys
// 8 j + 2 t (+1) of every key n-tile j.
//
// fp32 throughout, in log2 units: scores are scaled by softmax_scale * log2(e) first, then masked
// with a select (a masked score is -inf whatever the key row held), then exponentiated with exp2.
// Scaling before the max keeps the max right for any sign of the scale.
#pragma once

#include <cmath>
#include <cstdint>

#include "../common/ptx.cuh"
#include "../common/row_math.cuh"
#include "config.h"
#include "mma_tiles.cuh"

namespace jax_mla::portable {

struct SoftmaxState {
  float m[2];  // running row max (log2 units), -inf until the row has seen a key
  float l[2];  // this thread's partial row sums over its key columns (quad-reduced at the end)
};

// Scales the scores, masks keys a row may not see (token >= visible[i]), and returns the quad's
// row maxima. first_token: the sub-tile's first token.
__device__ __forceinline__ void scale_and_mask(ScoreTile& sc, float scale_log2, int first_token, const int (&visible)[2],
                                               int visible_min, int t, float (&row_max)[2]) {
  const bool needs_mask = first_token + kTileKeys > visible_min;
  row_max[0] = row_max[1] = -INFINITY;
#pragma unroll
  for (int j = 0; j < kKeyTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = e / 2;  // row g (e = 0, 1) or g + 8 (e = 2, 3)
      float x = sc[j][e] * scale_log2;
      if (needs_mask && first_token + 8 * j + 2 * t + (e & 1) >= visible[i]) x = -INFINITY;
      sc[j][e] = x;
      row_max[i] = fmaxf(row_max[i], x);
    }
  row_max[0] = quad_max(row_max[0]);
  row_max[1] = quad_max(row_max[1]);
}

// Folds the sub-tile into the running state: new max, the factor alpha that rescales O and l, and
// P = exp2(score - max) in place (masked keys give exactly 0).
__device__ __forceinline__ void online_softmax(ScoreTile& sc, const float (&row_max)[2], SoftmaxState& st,
                                               float (&alpha)[2]) {
  float m_ref[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const float m_new = fmaxf(st.m[i], row_max[i]);
    m_ref[i] = finite_or_zero(m_new);
    alpha[i] = ptx::exp2_approx(st.m[i] - m_ref[i]);  // m = -inf -> 0 (O and l are 0 then anyway)
    st.m[i] = m_new;
  }
  float sum[2] = {0.f, 0.f};
#pragma unroll
  for (int j = 0; j < kKeyTiles; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = e / 2;
      const float x = ptx::exp2_approx(sc[j][e] - m_ref[i]);
      sc[j][e] = x;
      sum[i] += x;
    }
#pragma unroll
  for (int i = 0; i < 2; ++i) st.l[i] = st.l[i] * alpha[i] + sum[i];
}

// O *= alpha per row. Skipped when every row of the warp keeps its max (alpha == 1 exactly, the
// common case once the max has settled): the result is the same bits either way.
__device__ __forceinline__ void rescale_o(OTile& o, const float (&alpha)[2]) {
  if (!__any_sync(0xffffffff, alpha[0] != 1.f || alpha[1] != 1.f)) return;
#pragma unroll
  for (int n = 0; n < kOTiles; ++n) {
    o[n][0] *= alpha[0];
    o[n][1] *= alpha[0];
    o[n][2] *= alpha[1];
    o[n][3] *= alpha[1];
  }
}

// P as the A fragments of P V: the accumulators of key n-tiles 2 kk and 2 kk + 1 are exactly the
// A fragment of k-step kk (mma.cuh layouts), rounded to the element type.
template <typename Element>
__device__ __forceinline__ void p_fragments(const ScoreTile& p, uint32_t (&pa)[kTileKeys / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < kTileKeys / 16; ++kk) {
    pa[kk][0] = pack2<Element>(p[2 * kk][0], p[2 * kk][1]);
    pa[kk][1] = pack2<Element>(p[2 * kk][2], p[2 * kk][3]);
    pa[kk][2] = pack2<Element>(p[2 * kk + 1][0], p[2 * kk + 1][1]);
    pa[kk][3] = pack2<Element>(p[2 * kk + 1][2], p[2 * kk + 1][3]);
  }
}

}  // namespace jax_mla::portable
