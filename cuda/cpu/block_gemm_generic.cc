// Baseline BlockGemm variant (SSE2 on x86-64, NEON on aarch64) and the run-time choice.
#define JAX_MLA_BLOCK_GEMM_VARIANT kBlockGemmGeneric
#include "cpu/block_gemm_impl.inc"

namespace jax_mla {
namespace cpu {

static const BlockGemm& best_block_gemm() {
#ifdef JAX_MLA_CPU_AVX2
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return kBlockGemmAvx2;
#endif
  return kBlockGemmGeneric;
}

const BlockGemm& block_gemm(bool baseline) {
  static const BlockGemm& best = best_block_gemm();
  return baseline ? kBlockGemmGeneric : best;
}

}  // namespace cpu
}  // namespace jax_mla
