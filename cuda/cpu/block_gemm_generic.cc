// Baseline BlockGemm variant (SSE2 on x86-64, NEON on aarch64) and the run-time choice.
#include <cstdlib>
#include <cstring>

#define JAX_MLA_BLOCK_GEMM_VARIANT kBlockGemmGeneric
#include "cpu/block_gemm_impl.inc"

namespace jax_mla {
namespace cpu {

static const BlockGemm& choose_block_gemm() {
  const char* isa = std::getenv("JAX_MLA_CPU_ISA");
  if (isa != nullptr && std::strcmp(isa, "generic") == 0) return kBlockGemmGeneric;
#ifdef JAX_MLA_CPU_AVX2
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return kBlockGemmAvx2;
#endif
  return kBlockGemmGeneric;
}

const BlockGemm& block_gemm() {
  static const BlockGemm& chosen = choose_block_gemm();
  return chosen;
}

}  // namespace cpu
}  // namespace jax_mla
