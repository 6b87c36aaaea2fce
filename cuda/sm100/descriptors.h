// Bit encoders for the three 32/64-bit words tcgen05 instructions take: the instruction
// descriptor of tcgen05.mma, the shared-memory matrix descriptor of its A/B operands, and a Tensor
// Memory (TMEM) address. Plain constexpr C++ (no CUDA headers), so that the host unit test
// (tests/cpu/cpp/sm100_descriptors.cc, run by tests/cpu/test_sm100_descriptors.py) checks the very
// functions the kernel uses against values derived by hand from the PTX ISA.
//
// References (PTX ISA 8.6+, chapter "Tensor Core 5th Generation Family Instructions", tcgen05):
//   - "Instruction descriptor"  (table "Instruction descriptor format for .kind::f16 and .kind::tf32")
//   - "Shared Memory Descriptor" (section "Matrix Descriptors", the tcgen05 one: it is NOT the wgmma
//     descriptor of sm_90a: it has a version field, a 3-bit base offset and a 3-bit swizzle field)
//   - "Tensor Memory Addressing" (a 32-bit address: lane in bits 31-16, column in bits 15-0)
#pragma once

#include <cstdint>

namespace jax_mla::sm100 {

// ---- Instruction descriptor (kind::f16, dense) ---------------------------------------------------
//
//   bits  0-1   sparsity selector              0 (dense)
//   bit   2     sparsity flag                  0 (dense)
//   bit   3     saturate                       0 (integer kinds only)
//   bits  4-5   D (accumulator) type           0 = F16, 1 = F32
//   bit   6     reserved
//   bits  7-9   A type                         kind::f16: 0 = F16, 1 = BF16
//   bits 10-12  B type                         kind::f16: 0 = F16, 1 = BF16
//   bit  13     negate A                       0
//   bit  14     negate B                       0
//   bit  15     transpose A ("A is MN-major")  0 = K-major
//   bit  16     transpose B ("B is MN-major")  0 = K-major, 1 = MN-major
//   bits 17-22  N >> 3
//   bit  23     reserved
//   bits 24-28  M >> 4
//   bit  29     reserved
//   bits 30-31  max shift (.ws only)           0 = no shift
// The descriptor is the 32-bit `idesc` operand of tcgen05.mma / tcgen05.mma.ws.

enum class MmaInput : uint32_t { kF16 = 0, kBF16 = 1 };
enum class Major : uint32_t { kK = 0, kMN = 1 };

constexpr uint32_t make_instr_desc_f16(MmaInput ab_type, int m, int n, Major a_major, Major b_major) {
  return (1u << 4)                                       // D = F32
         | (static_cast<uint32_t>(ab_type) << 7)        // A type
         | (static_cast<uint32_t>(ab_type) << 10)       // B type
         | (static_cast<uint32_t>(a_major) << 15)       // transpose A
         | (static_cast<uint32_t>(b_major) << 16)       // transpose B
         | ((static_cast<uint32_t>(n) >> 3) << 17)      // N >> 3, 6 bits
         | ((static_cast<uint32_t>(m) >> 4) << 24);     // M >> 4, 5 bits
}

// Shapes tcgen05.mma.ws.cta_group::1.kind::f16 accepts (PTX ISA, tcgen05.mma "Valid shapes"):
// M in {32, 64, 128}, N in {64, 128, 256}, K = 16.
constexpr bool valid_ws_f16_shape(int m, int n) {
  return (m == 32 || m == 64 || m == 128) && (n == 64 || n == 128 || n == 256);
}

// ---- Shared-memory matrix descriptor (tcgen05) ---------------------------------------------------
//
//   bits  0-13  matrix start address >> 4          (shared::cta byte address)
//   bits 16-29  leading dimension byte offset >> 4 (LBO)
//   bits 32-45  stride dimension byte offset >> 4  (SBO)
//   bits 46-48  fixed constant 0b001               (the descriptor version of sm_100)
//   bits 49-51  matrix base offset                 0: every swizzle atom here starts 1024-aligned
//   bit  52     LBO mode                           0: LBO is a relative byte offset
//   bits 53-60  fixed 0
//   bits 61-63  swizzling mode                     0 none, 1 128B with 32B atoms, 2 128B, 4 64B, 6 32B
//
// The canonical 128-byte-swizzle layouts (in 16-byte units, T = 8 elements of 16 bits):
//   K-major : ((8, m), (T, 2k)) : ((8T, SBO), (1, T))   rows of 128 B, 8-row groups SBO apart; LBO unused
//   MN-major: ((T, 8, m), (8, k)) : ((1, T, LBO), (8T, SBO))   64 MN-elements per 128-B row, the next
//             64 MN-elements LBO bytes away, the next 8 K-rows SBO bytes away
// Advancing K by 16 elements inside a K-major 128-byte row is a +32 byte start address (the
// hardware applies the swizzle to the final address bits, the base offset stays 0).

enum class Swizzle : uint64_t { kNone = 0, k128B_Base32B = 1, k128B = 2, k64B = 4, k32B = 6 };

constexpr uint64_t make_smem_desc(uint32_t smem_byte_addr, uint32_t leading_byte_offset,
                                  uint32_t stride_byte_offset, Swizzle swizzle) {
  return static_cast<uint64_t>((smem_byte_addr >> 4) & 0x3FFFu)                // start address
         | (static_cast<uint64_t>((leading_byte_offset >> 4) & 0x3FFFu) << 16)  // LBO
         | (static_cast<uint64_t>((stride_byte_offset >> 4) & 0x3FFFu) << 32)   // SBO
         | (static_cast<uint64_t>(1) << 46)                                     // version 0b001
         | (static_cast<uint64_t>(swizzle) << 61);                              // layout type
}

// A K-major 128B-swizzled operand stored as 8-row groups of 128-byte rows, groups 1024 B apart: Q,
// a K tile, P. LBO is ignored by the hardware for swizzled K-major layouts; 16 B (encoded 1) is the
// conventional value.
constexpr uint64_t smem_desc_k_major_sw128(uint32_t smem_byte_addr) {
  return make_smem_desc(smem_byte_addr, 16, 1024, Swizzle::k128B);
}

// An MN-major 128B-swizzled operand: V as the B operand of P V (K = tokens, N = latent columns),
// stored as token rows of 64 columns (one TMA box), the next 64 columns `box_bytes` further (LBO),
// the next 8 tokens 1024 bytes further (SBO).
constexpr uint64_t smem_desc_mn_major_sw128(uint32_t smem_byte_addr, uint32_t box_bytes) {
  return make_smem_desc(smem_byte_addr, box_bytes, 1024, Swizzle::k128B);
}

// ---- Tensor Memory address -----------------------------------------------------------------------
//
// 32-bit: lane (datapath row, 0-127) in bits 31-16, column (32-bit cell, 0-511) in bits 15-0. The
// base returned by tcgen05.alloc has lane 0 and the first allocated column.
constexpr uint32_t tmem_addr(uint32_t base, uint32_t lane, uint32_t column) {
  return base + (lane << 16) + column;
}

}  // namespace jax_mla::sm100
