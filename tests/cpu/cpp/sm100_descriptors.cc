// Host unit test of the tcgen05 descriptor encoders of the SM100 decode kernel
// (cuda/sm100/descriptors.h). Every expected value below is derived by hand from the PTX ISA bit
// tables (tcgen05 "Instruction descriptor", "Shared Memory Descriptor", "Tensor Memory Addressing"),
// not computed with the functions under test. Built and run by tests/cpu/test_sm100_descriptors.py with
// the host C++ compiler; the checks are static_asserts, so compiling is the test, and main() only
// prints the values.
#include <cinttypes>
#include <cstdio>

#include "sm100/descriptors.h"

using namespace jax_mla::sm100;

// ---- instruction descriptor, kind::f16 ---------------------------------------------------------
// D = F32: bit 4                                   0x00000010
// A = BF16: bits 7-9 = 1                           0x00000080
// B = BF16: bits 10-12 = 1                         0x00000400
// transpose B (MN-major): bit 16                   0x00010000
// N = 64: 64 >> 3 = 8 in bits 17-22                0x00100000
// N = 256: 256 >> 3 = 32 in bits 17-22             0x00400000
// M = 64: 64 >> 4 = 4 in bits 24-28                0x04000000
// M = 128: 128 >> 4 = 8 in bits 24-28              0x08000000
// S = Q K^T, bf16: M 64, N 64, both K-major        0x04000000 + 0x00100000 + 0x400 + 0x80 + 0x10
static_assert(make_instr_desc_f16(MmaInput::kBF16, 64, 64, Major::kK, Major::kK) == 0x04100490u);
static_assert(make_instr_desc_f16(MmaInput::kF16, 64, 64, Major::kK, Major::kK) == 0x04100010u);
// O += P V, bf16: M 64, N 256, B MN-major          0x04000000 + 0x00400000 + 0x10000 + 0x400 + 0x80 + 0x10
static_assert(make_instr_desc_f16(MmaInput::kBF16, 64, 256, Major::kK, Major::kMN) == 0x04410490u);
static_assert(make_instr_desc_f16(MmaInput::kF16, 64, 256, Major::kK, Major::kMN) == 0x04410010u);
// A transposed (bit 15), M 128, N 8 (1 << 17), fp16: 0x08000000 + 0x00020000 + 0x8000 + 0x10
static_assert(make_instr_desc_f16(MmaInput::kF16, 128, 8, Major::kMN, Major::kK) == 0x08028010u);
static_assert(valid_ws_f16_shape(64, 64) && valid_ws_f16_shape(64, 256) && !valid_ws_f16_shape(64, 32) &&
              !valid_ws_f16_shape(256, 64));

// ---- shared-memory descriptor -----------------------------------------------------------------
// K-major, 128B swizzle, start 0x1000:
//   start 0x1000 >> 4 = 0x100 (bits 0-13)            0x0000000000000100
//   LBO 16 >> 4 = 1 (bits 16-29)                     0x0000000000010000
//   SBO 1024 >> 4 = 64 (bits 32-45)                  0x0000004000000000
//   version 1 (bit 46)                               0x0000400000000000
//   swizzle 128B = 2 (bits 61-63)                    0x4000000000000000
static_assert(smem_desc_k_major_sw128(0x1000) == 0x4000404000010100ull);
// +32 bytes (K += 16 bf16 elements): start field + 2
static_assert(smem_desc_k_major_sw128(0x1020) == 0x4000404000010102ull);
// MN-major, 128B swizzle, start 0x2400, LBO 8192 (one 64-column box):
//   start 0x240, LBO 8192 >> 4 = 512 = 0x200 << 16 = 0x02000000
static_assert(smem_desc_mn_major_sw128(0x2400, 8192) == 0x4000404002000240ull);
// No swizzle, LBO 128, SBO 256, start 0x30: 0x3 | 8 << 16 | 16 << 32 | 1 << 46
static_assert(make_smem_desc(0x30, 128, 256, Swizzle::kNone) == 0x0000401000080003ull);
// The start field keeps 14 bits (addresses below 256 KB): 0x3FFF0 >> 4 = 0x3FFF
static_assert((make_smem_desc(0x3FFF0, 0, 0, Swizzle::kNone) & 0xFFFF) == 0x3FFF);

// ---- Tensor Memory address --------------------------------------------------------------------
// lane 32 (bits 31-16), column 288 = 0x120 (bits 15-0)
static_assert(tmem_addr(0, 32, 288) == 0x00200120u);
static_assert(tmem_addr(0x00000040u, 96, 0) == 0x00600040u);

int main() {
  std::printf("idesc_qk_bf16=0x%08x idesc_pv_bf16=0x%08x\n",
              make_instr_desc_f16(MmaInput::kBF16, 64, 64, Major::kK, Major::kK),
              make_instr_desc_f16(MmaInput::kBF16, 64, 256, Major::kK, Major::kMN));
  std::printf("smem_k=0x%016" PRIx64 " smem_mn=0x%016" PRIx64 "\n", smem_desc_k_major_sw128(0x1000),
              smem_desc_mn_major_sw128(0x2400, 8192));
  std::printf("ok\n");
  return 0;
}
