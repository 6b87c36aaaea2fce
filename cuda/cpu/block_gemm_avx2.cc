// AVX2 + FMA BlockGemm variant; compiled with -mavx2 -mfma (x86-64 only), run only on CPUs
// that report both (block_gemm_generic.cc).
#ifndef __AVX2__
#error "block_gemm_avx2.cc must be compiled with -mavx2 -mfma"
#endif

#define JAX_MLA_BLOCK_GEMM_VARIANT kBlockGemmAvx2
#include "cpu/block_gemm_impl.inc"
