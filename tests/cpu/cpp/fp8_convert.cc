// Host unit test of the FP8 cache's e4m3 -> 16-bit dequantization helpers (cuda/common/fp8_convert.cuh),
// built with the host C++ compiler (no CUDA headers: the header's host path) by
// tests/cpu/test_fp8_convert.py. Exhaustive over the e4m3 bytes and the power-of-two scales:
//   - the rounding function used as the reference (round16: double -> bf16 / fp16 bits, round to
//     nearest even, subnormals, overflow to inf) against two independent ones on ~7M fp32 inputs: the
//     bf16 bit trick (bf16 is truncated fp32) and the compiler's float -> _Float16 conversion;
//   - e4m3x4_place: every byte in every position of a word gives the documented bit pattern, whose
//     value is value(byte) * 2^kPlacedLog2 (value(byte) computed from the e4m3fn definition);
//   - fp8_fast_factor: accepts exactly +-0 and +-2^k for k in [kMinScaleExp, kMaxScaleExp] (scales
//     +-2^k for k in [-149, 20], fp32 subnormals included, and non-powers of two, inf, NaN), with the
//     factor +-2^(k - kPlacedLog2) in both halves; for every accepted scale and every non-NaN byte,
//     placed * factor (exact in double, rounded once by round16, as the 16-bit multiply does) equals
//     the reference: float(e4m3) * scale in fp32 (host float multiply), rounded by round16;
//   - the widest k range where that identity holds and the factor is a normal 16-bit value (printed:
//     the accepted range must lie inside it);
//   - e4m3_nan_bytes: flags exactly the words with a 0x7F / 0xFF byte, bit 7 of exactly those bytes
//     (every value in every position, the other bytes random).
// Prints a summary, some rounding samples for the Python side to compare with numpy / ml_dtypes, and
// "ok" last; exits nonzero on any mismatch.
#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "common/fp8_convert.cuh"

using jax_mla::Bf16Format;
using jax_mla::Fp16Format;

namespace {

int g_failures = 0;

void fail(const char* what, uint64_t a, uint64_t b, uint64_t c) {
  if (++g_failures <= 20) {
    std::printf("MISMATCH %s: 0x%" PRIx64 " 0x%" PRIx64 " 0x%" PRIx64 "\n", what, a, b, c);
  }
}

// A 16-bit binary float format.
struct Fmt16 {
  const char* name;
  int exp_bits;
  int mant_bits;
  int bias() const { return (1 << (exp_bits - 1)) - 1; }
};
constexpr Fmt16 kBf16{"bf16", 8, 7};
constexpr Fmt16 kFp16{"fp16", 5, 10};

float f32_from(uint32_t b) {
  float x;
  std::memcpy(&x, &b, 4);
  return x;
}

// value(b) of an e4m3fn byte from its definition (NaN for 0x7F / 0xFF).
double e4m3_value(uint32_t b) {
  const int e = (b >> 3) & 0xF;
  const int m = b & 7;
  if (e == 15 && m == 7) return NAN;
  const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return (b & 0x80) ? -mag : mag;
}

// The exact value of a 16-bit pattern of format f.
double decode16(uint32_t bits, const Fmt16& f) {
  const int e = (bits >> f.mant_bits) & ((1 << f.exp_bits) - 1);
  const int m = bits & ((1 << f.mant_bits) - 1);
  double mag;
  if (e == (1 << f.exp_bits) - 1) {
    mag = m == 0 ? INFINITY : NAN;
  } else if (e == 0) {
    mag = std::ldexp(static_cast<double>(m), 1 - f.bias() - f.mant_bits);
  } else {
    mag = std::ldexp(1.0 + std::ldexp(static_cast<double>(m), -f.mant_bits), e - f.bias());
  }
  return (bits & 0x8000) ? -mag : mag;
}

// x (not NaN) rounded to format f: round to nearest, ties to even, subnormals, +-inf past the largest
// finite value (and for x = +-inf). Exact arithmetic: scaling a double by a power of two is exact here.
uint32_t round16(double x, const Fmt16& f) {
  const uint32_t sign = std::signbit(x) ? 0x8000u : 0u;
  const double a = std::fabs(x);
  const uint32_t inf = sign | (((1u << f.exp_bits) - 1) << f.mant_bits);
  if (a == 0) return sign;
  if (std::isinf(a)) return inf;
  const int emin = 1 - f.bias();  // smallest normal exponent
  const int emax = f.bias();
  int e2;
  std::frexp(a, &e2);  // a in [2^(e2-1), 2^e2)
  const int quantum = std::max(e2 - 1, emin) - f.mant_bits;  // log2 of the spacing at a
  const double q = std::ldexp(a, -quantum);                  // exact
  double n = std::floor(q);
  const double rem = q - n;
  if (rem > 0.5 || (rem == 0.5 && std::fmod(n, 2.0) != 0.0)) n += 1.0;
  const double r = std::ldexp(n, quantum);
  if (r >= std::ldexp(1.0, emax + 1)) return inf;
  if (r < std::ldexp(1.0, emin)) return sign | static_cast<uint32_t>(n);  // subnormal (or zero)
  std::frexp(r, &e2);
  const int e = e2 - 1;
  const uint32_t m = static_cast<uint32_t>(std::ldexp(r, f.mant_bits - e)) - (1u << f.mant_bits);
  return sign | (static_cast<uint32_t>(e + f.bias()) << f.mant_bits) | m;
}

// ---- round16 against independent roundings --------------------------------------------------------

uint32_t bf16_bit_trick(uint32_t fbits) {  // RNE fp32 -> bf16 for non-NaN fp32 (inf stays inf)
  return (fbits + 0x7FFFu + ((fbits >> 16) & 1u)) >> 16;
}

void check_round16(std::vector<uint32_t>& samples) {
  static const uint32_t kLow[] = {0x000, 0x001, 0x7FF, 0x800, 0x801, 0xFFF, 0x5A3};
  long checked = 0;
  for (uint32_t top = 0; top < (1u << 20); ++top) {
    for (uint32_t low : kLow) {
      const uint32_t fbits = (top << 12) | low;
      const float x = f32_from(fbits);
      if (std::isnan(x)) continue;
      ++checked;
      const uint32_t b = round16(x, kBf16);
      if (b != bf16_bit_trick(fbits)) fail("round16 bf16 vs bit trick", fbits, b, bf16_bit_trick(fbits));
#ifdef __FLT16_MAX__
      const _Float16 h = static_cast<_Float16>(x);
      uint16_t hb;
      std::memcpy(&hb, &h, 2);
      if (round16(x, kFp16) != hb) fail("round16 fp16 vs _Float16", fbits, round16(x, kFp16), hb);
#endif
      if ((top * 2654435761u) >> 20 == 0 && low == 0x000) samples.push_back(fbits);  // ~1/4096 of them
    }
  }
#ifdef __FLT16_MAX__
  std::printf("round16: %ld fp32 inputs, bf16 vs bit trick, fp16 vs _Float16\n", checked);
#else
  std::printf("round16: %ld fp32 inputs, bf16 vs bit trick (no _Float16 on this compiler)\n", checked);
#endif
}

// ---- the fast path ----------------------------------------------------------------------------------

// The stated contract, independent of the header's constants: the placement, the placed pattern's
// scale 2^kPlaced and the accepted scale exponents [kLo, kHi] of each format.
template <typename Format>
struct Want;
template <>
struct Want<Bf16Format> {
  static constexpr int kPlaced = -120, kLo = -117, kHi = 7;
  static uint32_t placed(uint32_t b) { return ((b & 0x7Fu) << 4) | ((b & 0x80u) << 8); }
};
template <>
struct Want<Fp16Format> {
  static constexpr int kPlaced = -8, kLo = -22, kHi = 7;
  static uint32_t placed(uint32_t b) { return ((b & 0x7Fu) << 7) | ((b & 0x80u) << 8); }
};
// The header's constants say the same.
template <typename Format>
constexpr bool kHeaderAgrees = Want<Format>::kPlaced == Format::kPlacedLog2 &&
                               Want<Format>::kLo == Format::kMinScaleExp && Want<Format>::kHi == Format::kMaxScaleExp;
static_assert(kHeaderAgrees<Bf16Format> && kHeaderAgrees<Fp16Format>);

template <typename Format>
uint32_t expected_placed(uint32_t b) {
  return Want<Format>::placed(b);
}

template <typename Format>
void check_place(const Fmt16& f, std::mt19937& rng) {
  for (uint32_t b = 0; b < 256; ++b) {
    for (int pos = 0; pos < 4; ++pos) {
      for (int rep = 0; rep < 16; ++rep) {
        uint32_t w = rng();
        w = (w & ~(0xFFu << (8 * pos))) | (b << (8 * pos));
        uint32_t out[2];
        jax_mla::e4m3x4_place<Format>(w, out);
        for (int i = 0; i < 4; ++i) {
          const uint32_t bi = (w >> (8 * i)) & 0xFF;
          const uint32_t got = (out[i / 2] >> (16 * (i % 2))) & 0xFFFF;
          if (got != expected_placed<Format>(bi)) fail("e4m3x4_place", w, i, got);
        }
      }
    }
    // The placed pattern's value is value(b) * 2^kPlacedLog2 (exactly; NaN bytes excepted).
    if ((b & 0x7F) != 0x7F) {
      const double v = decode16(expected_placed<Format>(b), f);
      const double want = std::ldexp(e4m3_value(b), Want<Format>::kPlaced);
      if (v != want || std::signbit(v) != std::signbit(want)) fail("placed value", b, 0, 0);
    }
  }
}

// The fp32 bits of sign * 2^k (k in [-149, 127]; fp32 subnormal below -126).
uint32_t pow2_bits(int k, bool negative) {
  const uint32_t s = negative ? 0x80000000u : 0u;
  return s | (k >= -126 ? static_cast<uint32_t>(k + 127) << 23 : 1u << (k + 149));
}

// Every non-NaN byte: placed * factor (exact, rounded once) == round16(float(e4m3) * scale in fp32).
// The factor is given as a double (need not be a 16-bit value, for the exact-range scan).
bool products_match(uint32_t scale_bits, double factor, const Fmt16& f, long* count, bool report,
                    uint32_t (*placed_of)(uint32_t)) {
  const float scale = f32_from(scale_bits);
  bool ok = true;
  for (uint32_t b = 0; b < 256; ++b) {
    if ((b & 0x7F) == 0x7F) continue;
    const uint32_t fast = round16(decode16(placed_of(b), f) * factor, f);
    const float ref32 = static_cast<float>(e4m3_value(b)) * scale;
    const uint32_t ref = round16(ref32, f);
    if (count) ++*count;
    if (fast != ref) {
      ok = false;
      if (report) fail("fast product vs reference", scale_bits, b, (uint64_t{fast} << 16) | ref);
    }
  }
  return ok;
}

template <typename Format>
void check_fast(const Fmt16& f) {
  long products = 0;
  int accepted_lo = 1000, accepted_hi = -1000;
  // +-2^k, k in [-149, 20]: accepted iff k in [kMinScaleExp, kMaxScaleExp] (fp32 normal scales only).
  for (int k = -149; k <= 20; ++k) {
    for (bool neg : {false, true}) {
      const uint32_t bits = pow2_bits(k, neg);
      uint32_t factor2 = 0xDEADBEEF;
      const bool acc = jax_mla::fp8_fast_factor<Format>(bits, &factor2);
      const bool want = k >= Want<Format>::kLo && k <= Want<Format>::kHi;
      if (acc != want) fail("fp8_fast_factor acceptance", bits, acc, k);
      if (!acc) continue;
      accepted_lo = std::min(accepted_lo, k);
      accepted_hi = std::max(accepted_hi, k);
      const uint32_t lo = factor2 & 0xFFFF;
      if ((factor2 >> 16) != lo) fail("factor halves differ", bits, factor2, 0);
      const double factor = decode16(lo, f);
      const double want_factor = (neg ? -1.0 : 1.0) * std::ldexp(1.0, k - Want<Format>::kPlaced);
      if (factor != want_factor) fail("factor value", bits, lo, k);
      products_match(bits, factor, f, &products, true, expected_placed<Format>);
    }
  }
  // +-0: factor +-0, products +-0 with the reference's sign.
  for (bool neg : {false, true}) {
    const uint32_t bits = neg ? 0x80000000u : 0u;
    uint32_t factor2 = 0;
    if (!jax_mla::fp8_fast_factor<Format>(bits, &factor2)) {
      fail("fp8_fast_factor refuses zero", bits, 0, 0);
      continue;
    }
    if (factor2 != (neg ? 0x80008000u : 0u)) fail("zero factor", bits, factor2, 0);
    products_match(bits, decode16(factor2 & 0xFFFF, f), f, &products, true, expected_placed<Format>);
  }
  // Refused: non-powers of two, inf, NaN.
  int refused_checked = 0;
  for (int k = -126; k <= 20; ++k) {
    for (uint32_t m : {1u, 0x400000u, 0x7FFFFFu, 0x12345u}) {
      for (uint32_t s : {0u, 0x80000000u}) {
        uint32_t factor2;
        if (jax_mla::fp8_fast_factor<Format>(pow2_bits(k, false) | m | s, &factor2)) {
          fail("accepted non-power", k, m, s);
        }
        ++refused_checked;
      }
    }
  }
  for (uint32_t bits : {0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00000u, 0x7F800001u}) {
    uint32_t factor2;
    if (jax_mla::fp8_fast_factor<Format>(bits, &factor2)) fail("accepted inf/nan", bits, 0, 0);
    ++refused_checked;
  }
  // The widest range of normal fp32 scales 2^k around k = 0 where the identity holds with the ideal
  // factor and that factor is a normal 16-bit value.
  const int emin16 = 1 - f.bias(), emax16 = f.bias();
  auto exact = [&](int k) {
    const int fe = k - Want<Format>::kPlaced;
    if (fe < emin16 || fe > emax16) return false;
    for (bool neg : {false, true}) {
      if (!products_match(pow2_bits(k, neg), (neg ? -1.0 : 1.0) * std::ldexp(1.0, fe), f, nullptr, false,
                          expected_placed<Format>)) {
        return false;
      }
    }
    return true;
  };
  if (!exact(0)) fail("k = 0 not exact", 0, 0, 0);
  int lo = 0, hi = 0;
  while (lo - 1 >= -126 && exact(lo - 1)) --lo;
  while (hi + 1 <= 127 && exact(hi + 1)) ++hi;
  if (Want<Format>::kLo < lo || Want<Format>::kHi > hi) fail("accepted range not exact", lo, hi, 0);
  std::printf("%s: fast path accepts k in [%d, %d] (+-0 too); exact with a normal factor for k in [%d, %d]; "
              "%ld products checked; %d refusals checked\n",
              f.name, accepted_lo, accepted_hi, lo, hi, products, refused_checked);
}

// ---- NaN bytes ---------------------------------------------------------------------------------------

void check_nan_bytes(std::mt19937& rng) {
  long words = 0;
  for (int pos = 0; pos < 4; ++pos) {
    for (uint32_t v = 0; v < 256; ++v) {
      for (int rep = 0; rep < 64; ++rep) {
        uint32_t w = rng();
        if (rep < 32) w |= 0x80808080u & rng();  // other bytes: random, sometimes with high bits
        if (rep % 4 == 0) w = (w & 0x7E7E7E7Eu);  // and some words whose other bytes are never NaN
        w = (w & ~(0xFFu << (8 * pos))) | (v << (8 * pos));
        uint32_t want = 0;
        for (int i = 0; i < 4; ++i) {
          if (((w >> (8 * i)) & 0x7F) == 0x7F) want |= 0x80u << (8 * i);
        }
        const uint32_t got = jax_mla::e4m3_nan_bytes(w);
        if (got != want) fail("e4m3_nan_bytes", w, got, want);
        ++words;
      }
    }
  }
  std::printf("e4m3_nan_bytes: %ld words\n", words);
}

}  // namespace

int main() {
  std::mt19937 rng(12345);
  std::vector<uint32_t> samples;
  check_round16(samples);
  check_place<Bf16Format>(kBf16, rng);
  check_place<Fp16Format>(kFp16, rng);
  std::printf("e4m3x4_place: 256 bytes x 4 positions x 16 words, both formats\n");
  check_fast<Bf16Format>(kBf16);
  check_fast<Fp16Format>(kFp16);
  check_nan_bytes(rng);
  // Rounding samples (fp32 bits -> bf16, fp16 bits) for the Python side: ties, subnormals, overflow,
  // and a spread of ordinary values.
  static const uint32_t kSpecial[] = {
      0x3F808000u, 0x3F818000u, 0x3F808001u, 0x3F80FFFFu,  // bf16 ties to even (down, up), above, carry
      0x3F801000u, 0x3F803000u, 0x3F801001u,              // fp16 ties to even (down, up), above
      0x33000000u, 0x33000001u, 0x33C00000u, 0x337FFFFFu,  // fp16: half the smallest subnormal, just above, 1.5 x
      0x38800000u, 0x387FC000u, 0x387FE000u,              // fp16: the smallest normal, near it
      0x477FE000u, 0x477FEFFFu, 0x477FF000u, 0x47800000u,  // fp16: the largest finite, just below/at the overflow tie
      0x7F7F8000u, 0x7F7FFFFFu, 0x00400000u, 0x00008000u,  // bf16 overflow tie, fp32 subnormals
      0x00018000u, 0x80000000u, 0xBF808000u, 0xC7800000u,
  };
  for (uint32_t s : kSpecial) samples.push_back(s);
  for (uint32_t s : samples) {
    const float x = f32_from(s);
    std::printf("sample f32=0x%08x bf16=0x%04x fp16=0x%04x\n", s, round16(x, kBf16), round16(x, kFp16));
  }
  if (g_failures != 0) {
    std::printf("FAILED: %d mismatches\n", g_failures);
    return 1;
  }
  std::printf("ok\n");
  return 0;
}
