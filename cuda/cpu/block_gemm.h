// The two small matrix products of one KV block, the only code of the CPU kernel whose speed
// depends on the instruction set. Built twice on x86-64 (baseline SSE2 and AVX2 + FMA, see
// block_gemm_impl.inc) and picked at run time, so one wheel runs everywhere and uses AVX2 where
// the CPU has it.
#pragma once

#include <cstdint>

namespace jax_mla {
namespace cpu {

struct BlockGemm {
  // scores (num_rows, kBlockN) [:, 0:num_tokens] = q (num_rows, 576) . kv (num_tokens, 576)^T.
  // num_tokens must be a multiple of kBlockGemmTokenTile (pad kv with finite rows).
  void (*qk)(const float* q, int num_rows, const float* kv, int num_tokens, float* scores);
  // For every row i with visible[i] > 0:
  //   acc[i] (512) = acc[i] * correction[i] + sum_{j < visible[i]} prob[i, j] * kv[j, 0:512]
  // acc (num_rows, 512), correction (num_rows), prob (num_rows, kBlockN), visible (num_rows),
  // kv (>= max(visible), 576). Rows with visible[i] == 0 are left untouched.
  void (*pv)(float* acc, const float* correction, const float* prob, const int* visible, int num_rows,
             const float* kv);
  const char* name;  // "avx2" or "generic"
};

// Token rows the qk product handles at once.
inline constexpr int kBlockGemmTokenTile = 4;

// The variant for this CPU: AVX2 + FMA when built in and supported, or the baseline one when
// `baseline` (the handler passes JAX_MLA_CPU_ISA=generic, runtime/settings.h, to test it anywhere).
const BlockGemm& block_gemm(bool baseline);

// The variants themselves (block_gemm_generic.cc, block_gemm_avx2.cc).
extern const BlockGemm kBlockGemmGeneric;
#ifdef JAX_MLA_CPU_AVX2
extern const BlockGemm kBlockGemmAvx2;
#endif

}  // namespace cpu
}  // namespace jax_mla
