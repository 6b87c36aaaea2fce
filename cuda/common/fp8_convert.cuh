// Dequantization of the FP8 latent cache's float8_e4m3fn bytes (config.h, kFp8*) into the 16-bit
// element type (bf16 or fp16), shared by the GPU kernels. A latent value is float(e4m3) * scale
// (an fp32 product, exact), rounded once, to nearest even, to the element type: exactly
// jax_mla/_fp8.py unpack_fp8_kv(row, q's dtype).
//
// Two paths:
//   - the fast path, for a scale that is +-0 or an exact power of two +-2^k in a range (every scale
//     pack_fp8_kv writes is 2^k with k >= -13): each byte is placed into a 16-bit pattern by integer
//     ops (e4m3x4_place) and multiplied by one 16-bit factor (e4m3x16_to_scaled: one HMUL2 per two
//     values). It does not turn the NaN bytes 0x7F / 0xFF into NaN (they become finite values), so the
//     caller tests e4m3_nan_bytes() and takes the reference path for a chunk that has one;
//   - the reference path (dequantize_e4m3x8): e4m3 -> fp16 (hardware, exact) -> fp32, times the scale
//     in fp32, rounded to the element type; right for every byte and every scale.
//
// e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent field 0 is subnormal
// (value M / 8 * 2^-6); 0x7F and 0xFF are NaN; no infinities. Magnitudes: 2^-9 .. 448.
//
// Placement. With b = s|E(4)|M(3):
//   bf16 (8 exponent bits, bias 127, 7 mantissa bits): ((b & 0x7F) << 4) | ((b & 0x80) << 8) puts E
//     in the low 4 bits of the exponent field and M in the top 3 mantissa bits, so the pattern is
//     2^(E-127) (1 + M/8) = value(b) * 2^-120 (E > 0), and 2^-126 (M/8) = value(b) * 2^-120 for E == 0
//     (an e4m3 subnormal becomes a bf16 subnormal);
//   fp16 (5 exponent bits, bias 15, 10 mantissa bits): ((b & 0x7F) << 7) | ((b & 0x80) << 8) is
//     2^(E-15) (1 + M/8) = value(b) * 2^-8, and 2^-14 (M/8) = value(b) * 2^-8 for E == 0.
// The factor is then 2^(120+k) (bf16) or 2^(8+k) (fp16) for a scale of +-2^k, so that the 16-bit
// multiply's exact product is value(b) * 2^k, rounded once by the multiply (RNE, subnormal results
// included: mul.bf16x2 / mul.f16x2 do not flush) exactly as the reference rounds the exact fp32
// product. The accepted k (kMinScaleExp..kMaxScaleExp below) and why:
//   bf16, k in [-117, 7]: the factor 2^(120+k) must be a bf16 normal, biased exponent e + 120 (e the
//     scale's fp32 exponent field, k = e - 127) <= 254 -> k <= 7 (k = 8 would need 2^128). The lower
//     limit -117 is where value * 2^k stays exact in bf16 (2^-9 * 2^-117 = 2^-126, the smallest bf16
//     normal; 4 significant bits always fit in bf16's 8), so the multiply never rounds and never
//     makes a subnormal. Mathematically the path is exact down to k = -126 (the smallest normal fp32
//     scale; the fp32 product is exact there and the multiply rounds a subnormal result correctly), but
//     such scales never occur, so the range keeps the result-is-exact margin.
//   fp16, k in [-22, 7]: the factor 2^(8+k) must be an fp16 normal, biased exponent 8 + k + 15 =
//     e - 104 in [1, 30] (both limits are the factor's). Results never overflow (448 * 2^7 < 65504) but
//     may be subnormal (value * 2^k < 2^-14, possible for k <= -6) and, for k < -15, rounded, exactly
//     as the reference's: the fp32 product is exact for every k here and both round it once.
// Scale +-0: the factor is +-0 (a 16-bit zero), product +-0 with the reference's sign.
//
// Compiles for the device (nvcc) and for the host (a C++17 compiler, no CUDA headers): the integer
// helpers take a format tag (Bf16Format / Fp16Format, or the CUDA element types under nvcc, mapped by
// E4m3FormatOf) and have host emulations; e4m3x16_to_scaled and the reference path are device-only.
#pragma once

#include <cstdint>

#include "config.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <type_traits>

#include "row_math.cuh"
#endif

namespace jax_mla {

// Per element format constants of the fast path (see the header comment).
struct Bf16Format {
  static constexpr int kPlaceShift = 4;                 // (sign-extended byte pair) << 4 ...
  static constexpr uint32_t kPlaceMask = 0x87F087F0u;  // ... & mask: sign bit 15, b & 0x7F at bits 4..10
  static constexpr int kExpShift = 7;                   // exponent field position
  static constexpr int kFactorExpBias = 120;            // factor's exponent field = scale's + 120
  static constexpr int kMinScaleExp = -117;             // accepted scale 2^k, k in [min, max]
  static constexpr int kMaxScaleExp = 7;
  static constexpr int kPlacedLog2 = -120;              // placed pattern = value(b) * 2^kPlacedLog2
};
struct Fp16Format {
  static constexpr int kPlaceShift = 7;                 // sign bit 15, b & 0x7F at bits 7..13
  static constexpr uint32_t kPlaceMask = 0xBF80BF80u;
  static constexpr int kExpShift = 10;
  static constexpr int kFactorExpBias = -104;           // factor's exponent field = scale's - 104
  static constexpr int kMinScaleExp = -22;
  static constexpr int kMaxScaleExp = 7;
  static constexpr int kPlacedLog2 = -8;
};

// The format of an element type: a format maps to itself; under nvcc the CUDA types map to theirs.
template <typename T>
struct E4m3FormatOf {
  using type = T;
};
#if defined(__CUDACC__)
template <>
struct E4m3FormatOf<__nv_bfloat16> {
  using type = Bf16Format;
};
template <>
struct E4m3FormatOf<__half> {
  using type = Fp16Format;
};
#endif

// PRMT (prmt.b32, default mode): byte n of the result is byte (s >> 4n) & 7 of the 8 bytes {y:x}
// (x bytes 0..3), or, when bit 3 of that selector nibble is set, that byte's sign bit replicated over
// all 8 bits. The sign mode is PTX's, not __byte_perm's documented one (which keeps only 3 selector
// bits), hence the inline PTX on the device.
MLA_HOST_DEVICE uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t s) {
#ifdef __CUDA_ARCH__
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(x), "r"(y), "r"(s));
  return r;
#else
  const uint64_t src = (static_cast<uint64_t>(y) << 32) | x;
  uint32_t r = 0;
  for (int n = 0; n < 4; ++n) {
    const uint32_t sel = (s >> (4 * n)) & 0xFu;
    uint32_t byte = static_cast<uint32_t>(src >> (8 * (sel & 7u))) & 0xFFu;
    if (sel & 8u) byte = (byte & 0x80u) ? 0xFFu : 0u;
    r |= byte << (8 * n);
  }
  return r;
#endif
}

// The fast path's factor for a scale with fp32 bits `scale_bits`: true iff the scale is +-0 or
// +-2^k with k in [kMinScaleExp, kMaxScaleExp] of Element's format (mantissa bits zero, exponent field
// e = k + 127 in range; fp32 subnormal, inf and NaN scales are refused); then *factor2 = the 16-bit
// factor (+-2^(k + 120) bf16, +-2^(k + 8) fp16, +-0 for a zero scale) in both halves.
template <typename Element>
MLA_HOST_DEVICE bool fp8_fast_factor(uint32_t scale_bits, uint32_t* factor2) {
  using F = typename E4m3FormatOf<Element>::type;
  const uint32_t sign = (scale_bits >> 16) & 0x8000u;
  const uint32_t e = (scale_bits >> 23) & 0xFFu;
  const uint32_t mantissa = scale_bits & 0x7FFFFFu;
  constexpr uint32_t kMinE = static_cast<uint32_t>(127 + F::kMinScaleExp);
  constexpr uint32_t kMaxE = static_cast<uint32_t>(127 + F::kMaxScaleExp);
  static_assert(kMinE >= 1 && kMaxE <= 254, "a finite normal fp32 scale");
  static_assert(127 + F::kMinScaleExp + F::kFactorExpBias >= 1 &&
                    127 + F::kMaxScaleExp + F::kFactorExpBias <= (F::kExpShift == 7 ? 254 : 30),
                "the factor is a finite normal 16-bit value");
  if (mantissa != 0) return false;
  uint32_t f16;
  if (e == 0) {
    f16 = sign;  // +-0
  } else if (e - kMinE <= kMaxE - kMinE) {  // unsigned: kMinE <= e <= kMaxE
    f16 = sign | ((e + static_cast<uint32_t>(F::kFactorExpBias)) << F::kExpShift);
  } else {
    return false;
  }
  *factor2 = f16 | (f16 << 16);
  return true;
}

// Four e4m3 bytes of w (byte i = value i) placed as 16-bit patterns (value(b) * 2^kPlacedLog2):
// out[0] = values 0 (low half), 1 (high half); out[1] = values 2, 3. Per word: one PRMT making each
// half the byte sign-extended to 16 bits (s...s|b), one shift putting b & 0x7F in place and the
// extension's sign bit at bit 15, one AND keeping those bits (the shifted-out high bits of the low half
// land in the high half's bits the mask clears).
template <typename Element>
MLA_HOST_DEVICE void e4m3x4_place(uint32_t w, uint32_t out[2]) {
  using F = typename E4m3FormatOf<Element>::type;
  out[0] = (byte_perm(w, 0u, 0x9180u) << F::kPlaceShift) & F::kPlaceMask;
  out[1] = (byte_perm(w, 0u, 0xB3A2u) << F::kPlaceShift) & F::kPlaceMask;
}

// Nonzero iff a byte of w is an e4m3 NaN (0x7F or 0xFF). Per byte: its low 7 bits plus 1 is at most
// 0x7F + 1 = 0x80, so the addition never carries into the next byte, and bit 7 of the sum is set iff
// the low 7 bits were all ones.
MLA_HOST_DEVICE uint32_t e4m3_nan_bytes(uint32_t w) {
  return ((w & 0x7F7F7F7Fu) + 0x01010101u) & 0x80808080u;
}

#if defined(__CUDACC__)

// Fast path: 16 e4m3 bytes (byte i of raw = value i) -> 16 values of Element, out[0] = values 0-7,
// out[1] = values 8-15 (each word two values, low half first). factor2 from fp8_fast_factor<Element>;
// bytes 0x7F / 0xFF give finite values, not NaN (test e4m3_nan_bytes first).
template <typename Element>
__device__ __forceinline__ void e4m3x16_to_scaled(uint4 raw, uint32_t factor2, uint4 out[2]) {
  static_assert(std::is_same_v<Element, __nv_bfloat16> || std::is_same_v<Element, __half>);
  using Pair = std::conditional_t<std::is_same_v<Element, __nv_bfloat16>, __nv_bfloat162, __half2>;
  const uint32_t in[4] = {raw.x, raw.y, raw.z, raw.w};
  uint32_t* o = reinterpret_cast<uint32_t*>(out);
  const Pair f = *reinterpret_cast<const Pair*>(&factor2);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t placed[2];
    e4m3x4_place<Element>(in[i], placed);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const Pair v = __hmul2(*reinterpret_cast<const Pair*>(&placed[j]), f);
      o[2 * i + j] = *reinterpret_cast<const uint32_t*>(&v);
    }
  }
}

// Reference path: 8 e4m3 bytes (byte i = value i) times an fp32 scale -> 8 values of Element (one
// 16-byte chunk, two values a word, low half first). Right for every byte (NaN stays NaN) and scale.
template <typename Element>
__device__ __forceinline__ uint4 dequantize_e4m3x8(uint2 e4m3, float scale) {
  uint4 out;
  uint32_t* w = reinterpret_cast<uint32_t*>(&out);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    // Two e4m3 -> two fp16 (exact: every e4m3 value is an fp16 value) -> fp32, times the scale.
    const uint32_t pair = (i < 2 ? e4m3.x : e4m3.y) >> (16 * (i % 2));
    const __half2_raw h2 = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(pair), __NV_E4M3);
    const float2 f = __half22float2(__half2(h2));
    w[i] = pack2<Element>(f.x * scale, f.y * scale);
  }
  return out;
}

// The FP8 row's RoPE part: 8 bf16 values kept as they are (bf16) or rounded to fp16.
template <typename Element>
__device__ __forceinline__ uint4 rope_bf16x8_to(uint4 bf16x8) {
  if constexpr (std::is_same_v<Element, __half>) {
    uint32_t* w = reinterpret_cast<uint32_t*>(&bf16x8);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[i]));
      w[i] = pack2<Element>(f.x, f.y);
    }
  }
  return bf16x8;
}

#endif  // __CUDACC__

}  // namespace jax_mla
