// The CPU decode kernel: the same split-KV algorithm as the GPU kernels (scheduler.h), run by
// host threads. It is the "cpu" platform implementation of the jax_mla_decode FFI target and a
// readable statement of what every GPU kernel computes.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/problem.h"

namespace jax_mla {

// Runs the decode described by `params` (all pointers are host pointers):
//   1. every (part, m-block of kBlockM query rows) task walks the pieces of its part and
//      computes, per query row, an fp32 online softmax over the piece's KV blocks;
//      a request cut into one piece writes out / lse directly, one cut into several writes
//      its piece's normalised output and lse into partial_out / partial_lse at the piece's slot;
//   2. a combine pass merges the partials of requests with >= 2 pieces and writes
//      out = 0, lse = -inf for requests with no piece (seq_len == 0).
// Preconditions (checked by the FFI handler, not here):
//   - params.schedule is the schedule of params.seq_lens for params.num_parts parts;
//   - every seq_len is in [0, max_pages * page_size] and every page id a request reads is in
//     [0, num_pages);
//   - partial_lse / partial_out hold max_splits(batch, num_parts) slots.
// `baseline_gemm` runs the baseline block products instead of the best for this CPU (block_gemm.h);
// `max_threads` caps the worker threads (<= 0: std::thread::hardware_concurrency()).
void decode_cpu(const DecodeProblem& params, bool baseline_gemm = false, int max_threads = 0);

// ---------------------------------------------------------------------------------------------
// 16-bit float conversions (round-to-nearest-even; NaN stays NaN, overflow goes to +-inf).
// Inline because the kernel converts every q / KV element it reads and every output it writes.
// ---------------------------------------------------------------------------------------------

inline uint32_t float_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}

inline float bits_float(uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

// bf16 is the top half of an fp32.
inline float bf16_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

inline uint16_t float_to_bf16(float x) {
  const uint32_t u = float_bits(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  // Adding 0x7fff plus the lowest kept bit rounds half-way cases to the even neighbour;
  // a carry out of the mantissa correctly bumps the exponent (up to inf).
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// float8_e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities, S.1111.111 is NaN.
// Every value is exact in fp32.
inline float fp8_e4m3_to_float(uint8_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
  const uint32_t exponent = (v >> 3) & 0xfu;
  const uint32_t mantissa = v & 0x7u;
  if (exponent == 0xfu && mantissa == 0x7u) return bits_float(sign | 0x7fc00000u);
  if (exponent == 0) return bits_float(sign | float_bits(static_cast<float>(mantissa) * 0.001953125f));  // * 2^-9
  return bits_float(sign | ((exponent + (127 - 7)) << 23) | (mantissa << 20));
}

// fp16: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  uint32_t magnitude;
  if (exponent == 0x1fu) {
    magnitude = 0x7f800000u | (mantissa << 13);  // inf / NaN (payload kept)
  } else if (exponent != 0) {
    magnitude = ((exponent + (127 - 15)) << 23) | (mantissa << 13);  // normal: rebias
  } else {
    // Zero or subnormal: mantissa * 2^-24, exact in fp32.
    magnitude = float_bits(static_cast<float>(mantissa) * 5.9604644775390625e-8f);
  }
  return bits_float(sign | magnitude);
}

inline uint16_t float_to_fp16(float x) {
  const uint32_t u = float_bits(x);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;  // NaN
  // 65520 is half-way between the largest fp16 (65504, odd mantissa) and 65536: it and
  // everything above round to inf.
  if (a >= 0x477ff000u) return sign | 0x7c00u;
  if (a < 0x38800000u) {
    // Below 2^-14, the smallest normal: subnormal result in units of 2^-24. Adding 2^23 makes
    // the fp32 adder round the scaled value to an integer, half-way cases to even. A result of
    // 0x400 is the smallest normal, which is also its correct encoding.
    const float scaled = bits_float(a) * 16777216.0f;  // * 2^24, exact
    const uint32_t units = float_bits(scaled + 8388608.0f) - 0x4b000000u;
    return sign | static_cast<uint16_t>(units);
  }
  // Normal: rebias the exponent, then round the 23-bit mantissa to 10 bits (to nearest even).
  uint32_t m = a - ((127u - 15u) << 23);
  m += 0xfffu + ((m >> 13) & 1u);
  return sign | static_cast<uint16_t>(m >> 13);
}

}  // namespace jax_mla
