// The self-check's problems (runtime/self_check.cu): one table of cases, their inputs and the
// schedule each gets, in plain C++ so that the CPU test tests/cpu/cpp/self_check_coverage.cc builds
// exactly the same problems and schedules and asserts which kernel paths they reach (piece
// boundaries, the lazy-rescale path, every row count, ...), so that the coverage cannot shrink
// unnoticed. docs/design.md ("Self-check") has the coverage table.
//
// Every case runs in bf16 and in fp16. Inputs are deterministic (an LCG) and exact in both 16-bit
// types: values are multiples of 1/256 in [-1, 1) (8 significant bits at most), so the host's
// conversion is exact and the CPU test can recompute every score. Q's 64 RoPE columns are positive
// ([0.25, 1)); a "hot" key has all 64 RoPE columns equal to a large value, so its score exceeds every
// earlier one of its row by far more than the kernels' lazy-rescale slack (common/config.h
// kLazyRescaleSlack): the rescale of O runs. Cache rows that no request may read (past a length,
// unused pages) hold NaN, so a kernel that lets one reach the output fails the comparison.
//
// The FP8 cache (KvFormat::kFp8, common/config.h): for a candidate that reads it, every case also
// runs over an FP8 cache (in bf16 and fp16), against the portable kernel's FP8 path. make_fp8_cache
// packs the case's 16-bit rows exactly as jax_mla/_fp8.py pack_fp8_kv does (rows no request may read
// stay all NaN: NaN scale, NaN bytes, NaN RoPE values), then varies the tiles (a second LCG, so the
// 16-bit inputs do not change) so that every dequantization path of the kernels runs on values the
// comparison sees (common/fp8_convert.cuh): power-of-two scales (the fast path), odd scales and a
// power of two outside fp16's exact range (the fp32 reference path, per warp step), negative and zero
// scales, random e4m3 bytes (subnormal ones included), dead rows (past a length, loaded with the
// tile) with NaN scales or NaN bytes beside read rows, and one NaN byte in a row a whole request
// reads (Case::fp8_nan_request: that request is NaN in both kernels, as for a bad page id).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <vector>

#include "common/config.h"
#include "common/problem.h"
#include "common/scheduler.h"
#include "common/workspace.h"

namespace jax_mla::self_check {

inline constexpr int kMaxBatch = 10;
inline constexpr int kMaxHot = 3;
inline constexpr float kSoftmaxScale = 1.f / 24.f;  // 576 ** -0.5, the default

// A key whose 64 RoPE columns all hold `rope` (request, token).
struct HotKey {
  int request = -1;
  int token = 0;
  float rope = 0.f;
};

struct Case {
  const char* name;  // what it is for (reported by a failing check)
  int seq_q = 1, heads_q = 16;
  bool causal = false;
  int page_size = 64;
  int num_parts = 1;
  int batch = 0;
  int lens[kMaxBatch] = {};
  // A request whose block-table row holds an id outside the cache among the pages it reads: both
  // kernels write NaN for it (-1: none). bad_past_end: the id is num_pages (else -2).
  int bad_request = -1;
  bool bad_past_end = false;
  // 0: every block-table entry of a request has its own page. n > 0: the entries of a request's
  // full pages cycle through n pages, so a long context costs n pages of memory; its last page is
  // always its own (its rows past the length hold NaN).
  int shared_pages = 0;
  HotKey hot[kMaxHot] = {};
  int unused_pages = 3;  // pages no request reads (all NaN)
  // FP8 cache only: a request with one NaN e4m3 byte (under a power-of-two scale) in token
  // fp8_nan_token, which every one of its query rows sees: both kernels write NaN for the whole
  // request (-1: none).
  int fp8_nan_request = -1;
  int fp8_nan_token = 0;
  // Runs over the FP8 cache only (runs_in): pages of one token, the sparse decode's view, which the
  // SM90 and SM100 kernels read only from an FP8 cache (their producer warp gathers the rows:
  // common/fp8_tile.cuh gather_fp8_tile); a 16-bit cache of one-token pages never reaches them.
  bool fp8_only = false;

  int rows() const { return seq_q * heads_q; }
};

// The cases, in the order the self-check runs them (it stops at the first failure).
inline std::vector<Case> cases() {
  std::vector<Case> v;
  auto add = [&](const char* name, int seq_q, int heads_q, bool causal, int page_size, int num_parts,
                 std::initializer_list<int> lens) -> Case& {
    Case c;
    c.name = name;
    c.seq_q = seq_q;
    c.heads_q = heads_q;
    c.causal = causal;
    c.page_size = page_size;
    c.num_parts = num_parts;
    for (int len : lens) c.lens[c.batch++] = len;
    v.push_back(c);
    return v.back();
  };
  // Line plan, several pieces per part: piece boundaries of every kind (pieces of 1, 2 and more
  // tiles, a part's first piece a split one), a request with a bad page id between good ones, an
  // empty request, pages of 32 (a tile spans two pages).
  {
    Case& c = add("pieces", 2, 16, true, 32, 2, {0, 45, 200, 64, 1, 520, 2, 130, 200, 65});
    c.bad_request = 7;
  }
  // Lazy rescale of O: hot keys in later tiles of a piece; s_q = 1, non-causal, 64 rows, pages of 256
  // (four tiles per page), one part holding two pieces of many tiles.
  {
    Case& c = add("rescale", 1, 64, false, 256, 1, {700, 300});
    c.hot[0] = {0, 200, 5.f};
    c.hot[1] = {0, 650, 10.f};
    c.hot[2] = {1, 170, 5.f};
    c.unused_pages = 1;
  }
  // 128 rows (two row blocks), s_q = 1 causal, pages of 64, a request split over two parts.
  add("h128", 1, 128, true, 64, 3, {520, 200}).unused_pages = 1;
  // s_q = 4 causal: a request shorter than s_q (rows with no visible key), per-token visible
  // lengths, pages of 16 (four pages per tile), a bad page id one past the cache.
  {
    Case& c = add("sq4_causal", 4, 16, true, 16, 4, {2, 97, 515, 40});
    c.bad_request = 3;
    c.bad_past_end = true;
  }
  // s_q = 4 without causal masking; over an FP8 cache, a NaN e4m3 byte in a key request 1 reads.
  {
    Case& c = add("sq4", 4, 16, false, 64, 2, {300, 64, 129});
    c.fp8_nan_request = 1;
    c.fp8_nan_token = 10;
  }
  // A 16K+ context in a few pages: long pieces (phases of every ring wrap many times), a hot key near
  // the end of the second piece.
  {
    Case& c = add("long", 1, 16, false, 64, 2, {16411});
    c.shared_pages = 16;
    c.hot[0] = {0, 16390, 5.f};
  }
  // The sparse decode's view (runtime/sparse_launch.h: one request per query token, pages of one
  // token, s_q 1, not causal), over the FP8 cache only: the gathered tiles. An empty request, a
  // slot past the cache, a NaN e4m3 byte, a hot key (the rescale), one request over three parts.
  {
    Case& c = add("gathered", 1, 64, false, 1, 3, {0, 1, 64, 200, 130, 300});
    c.fp8_only = true;
    c.bad_request = 4;
    c.bad_past_end = true;
    c.fp8_nan_request = 2;
    c.fp8_nan_token = 10;
    c.hot[0] = {5, 250, 5.f};
  }
  return v;
}

// Whether the self-check runs case c over a cache of format f.
inline bool runs_in(const Case& c, KvFormat f) { return !c.fp8_only || f == KvFormat::kFp8; }

// Both element types, in the order the self-check runs them.
inline constexpr DType kDTypes[2] = {DType::kBF16, DType::kF16};
inline const char* dtype_name(DType t) { return t == DType::kBF16 ? "bfloat16" : "float16"; }

// The cache formats the self-check runs every case in (both element types each), in this order: the
// 16-bit cache, then the FP8 cache when the candidate reads it (runtime/kernel_select.h
// reads_fp8_cache), so that "auto" takes the candidate for either format only after a passing check.
inline std::vector<KvFormat> kv_formats(bool candidate_reads_fp8) {
  std::vector<KvFormat> f{KvFormat::kDense};
  if (candidate_reads_fp8) f.push_back(KvFormat::kFp8);
  return f;
}
inline const char* format_name(KvFormat f) { return f == KvFormat::kFp8 ? "fp8" : "dense"; }

// A request both kernels must write as NaN (every out and lse value): a bad page id, or over an FP8
// cache the request with a NaN e4m3 byte.
inline bool nan_request(const Case& c, KvFormat f, int request) {
  return request == c.bad_request || (f == KvFormat::kFp8 && request == c.fp8_nan_request);
}

// ---- exact 16-bit values ------------------------------------------------------------------------

// x is NaN, 0 or a normal number of at most 8 significant bits in the range of both types: the
// conversion is exact (no rounding to decide).
inline uint16_t to_bits(float x, DType t) {
  if (std::isnan(x)) return t == DType::kBF16 ? 0x7FC0 : 0x7E00;
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if (t == DType::kBF16) return static_cast<uint16_t>(u >> 16);
  const uint32_t sign = (u >> 16) & 0x8000u;
  if ((u & 0x7FFFFFFFu) == 0) return static_cast<uint16_t>(sign);
  const uint32_t exp = ((u >> 23) & 0xFFu) - 127 + 15;  // normal in fp16 for the values used here
  return static_cast<uint16_t>(sign | (exp << 10) | ((u >> 13) & 0x3FFu));
}

inline float from_bits(uint16_t b, DType t) {
  uint32_t u;
  if (t == DType::kBF16) {
    u = static_cast<uint32_t>(b) << 16;
  } else {
    const uint32_t sign = (b & 0x8000u) << 16, exp = (b >> 10) & 0x1Fu, man = b & 0x3FFu;
    if (exp == 0x1F) {
      u = sign | 0x7F800000u | (man << 13);
    } else if (exp != 0) {
      u = sign | ((exp - 15 + 127) << 23) | (man << 13);
    } else {  // zero or subnormal: man * 2^-24
      float f = std::ldexp(static_cast<float>(man), -24);
      return sign ? -f : f;
    }
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Lcg {  // deterministic inputs, no dependency on a host RNG library
  uint64_t s = 0x9E3779B97F4A7C15ull;
  uint32_t next() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(s >> 33);
  }
  float uniform() { return static_cast<float>(static_cast<int>(next() % 512u) - 256) / 256.f; }  // [-1, 1)
  float positive() { return static_cast<float>(64 + static_cast<int>(next() % 192u)) / 256.f; }  // [0.25, 1)
};

// ---- inputs -------------------------------------------------------------------------------------

inline int entries_of(const Case& c, int r) { return (c.lens[r] + c.page_size - 1) / c.page_size; }

// Columns of the block table: the longest request's entries and one more (an invalid id nobody may
// read).
inline int max_pages_of(const Case& c) {
  int m = 0;
  for (int r = 0; r < c.batch; ++r) m = std::max(m, entries_of(c, r));
  return m + 1;
}

// Pages request r occupies (shared_pages: its full pages share them, its last page is its own).
inline int pages_of(const Case& c, int r) {
  const int n = entries_of(c, r);
  return c.shared_pages > 0 && n > 1 ? std::min(n - 1, c.shared_pages) + 1 : n;
}

inline int num_pages_of(const Case& c) {
  int n = c.unused_pages;
  for (int r = 0; r < c.batch; ++r) n += pages_of(c, r);
  return n;
}

struct Inputs {
  int num_pages = 0, max_pages = 0;
  std::vector<uint16_t> q;      // (b, s_q, h_q, 576)
  std::vector<uint16_t> kv;     // (num_pages, page_size, 576)
  std::vector<int32_t> table;   // (b, max_pages); unused entries -1
  std::vector<int32_t> lens;    // (b,)
  std::vector<uint8_t> kv_fp8;  // (num_pages, page_size, 656) FP8 rows (KvFormat::kFp8 only), from kv
};

// ---- the FP8 cache (common/config.h kFp8*) ------------------------------------------------------

inline uint32_t float_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// float8_e4m3fn: sign, 4 exponent bits (bias 7), 3 mantissa bits; 0x7F / 0xFF NaN.
inline float e4m3_value(uint8_t b) {
  const uint32_t e = (b >> 3) & 0xFu, m = b & 7u;
  if ((b & 0x7F) == 0x7F) return NAN;
  // Subnormal: m * 2^-9; normal: (1 + m / 8) 2^(e - 7), i.e. fp32 exponent field e + 120.
  const float v = e == 0 ? static_cast<float>(m) * (1.f / 512.f) : bits_float(((e + 120u) << 23) | (m << 20));
  return (b & 0x80) ? -v : v;
}

// x (|x| <= 448, or NaN) rounded to the nearest e4m3 value, ties to even (as JAX's cast).
inline uint8_t e4m3_from_float(float x) {
  if (std::isnan(x)) return 0x7F;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const float a = std::fabs(x);
  uint32_t code;
  if (a < 1.f / 64.f) {  // the subnormal range, quantum 2^-9 (2^-6 itself is code 8: the sums agree)
    code = static_cast<uint32_t>(std::nearbyint(a * 512.f));  // exact scaling, then round to even
  } else {  // round the fp32 significand to 3 bits, to even (a carry moves into the exponent)
    uint32_t u = float_bits(a);
    u += 0x7FFFFu + ((u >> 20) & 1u);
    u &= ~0xFFFFFu;
    code = ((((u >> 23) & 0xFFu) - 120u) << 3) | ((u >> 20) & 7u);
  }
  return static_cast<uint8_t>(sign | code);
}

// One row of 576 values (NaN allowed) packed exactly as jax_mla/_fp8.py pack_fp8_kv: per tile of 128,
// amax = max |x|, scale = 2^ceil(log2(max(amax / 448, 1e-4))) in float32 (NaN when the tile has a
// NaN), e4m3(clip(x / scale, -448, 448)); the RoPE values as bf16 (exact here: they are 16-bit values
// of both types, or NaN).
inline void pack_fp8_row(const float* x, uint8_t* out) {
  for (int t = 0; t < kFp8Tiles; ++t) {
    const float* v = x + t * kFp8TileCols;
    float amax = 0.f;
    bool nan = false;
    for (int i = 0; i < kFp8TileCols; ++i) {
      nan |= std::isnan(v[i]);
      amax = std::max(amax, std::fabs(v[i]));
    }
    float scale = NAN;
    if (!nan) {
      const float y = std::max(amax / 448.f, 1e-4f);
      const uint32_t u = float_bits(y);
      scale = (u & 0x7FFFFFu) == 0 ? y : bits_float((u & 0x7F800000u) + 0x00800000u);
    }
    for (int i = 0; i < kFp8TileCols; ++i) {
      out[t * kFp8TileCols + i] = e4m3_from_float(nan ? NAN : std::min(448.f, std::max(-448.f, v[i] / scale)));
    }
    std::memcpy(out + kFp8ScalesOffset + 4 * t, &scale, 4);
  }
  for (int i = 0; i < kHeadDimRope; ++i) {
    const float r = x[kHeadDimV + i];
    const uint16_t b = std::isnan(r) ? 0x7FC0 : static_cast<uint16_t>(float_bits(r) >> 16);
    std::memcpy(out + kFp8RopeOffset + 2 * i, &b, 2);
  }
}

inline float fp8_scale(const uint8_t* row, int tile) {
  float s;
  std::memcpy(&s, row + kFp8ScalesOffset + 4 * tile, 4);
  return s;
}
inline void set_fp8_scale(uint8_t* row, int tile, float s) { std::memcpy(row + kFp8ScalesOffset + 4 * tile, &s, 4); }

// Column col of a packed row as the exact product float(e4m3) * scale (latent part) or the bf16 RoPE
// value: what unpack_fp8_kv computes before its one rounding to q's dtype.
inline float fp8_row_value(const uint8_t* row, int col) {
  if (col < kHeadDimV) return e4m3_value(row[col]) * fp8_scale(row, col / kFp8TileCols);
  uint16_t b;
  std::memcpy(&b, row + kFp8RopeOffset + 2 * (col - kHeadDimV), 2);
  return bits_float(static_cast<uint32_t>(b) << 16);
}

// How make_fp8_cache varies a tile of a row that holds data (the paths they reach: header comment).
enum class Fp8Tile : int {
  kPacked,       // as pack_fp8_kv wrote it: scale 2^-8 .. 2^-13
  kRandomBytes,  // random e4m3 bytes (no NaN, subnormals included) with the scale 2^-9
  kOddScale,     // the packed bytes with the scale times 1.5 (not a power of two)
  kNegative,     // the packed scale negated
  kZero,         // scale +0
  kTiny,         // the packed bytes with the scale 2^-30: exact for bf16's fast path, not fp16's
};
// Out of 32: 20 packed, 6 random bytes, 3 odd scales, 1 negative, 1 zero, 1 tiny.
inline Fp8Tile fp8_tile_kind(uint32_t r) {
  r %= 32;
  if (r < 20) return Fp8Tile::kPacked;
  if (r < 26) return Fp8Tile::kRandomBytes;
  if (r < 29) return Fp8Tile::kOddScale;
  return r == 29 ? Fp8Tile::kNegative : r == 30 ? Fp8Tile::kZero : Fp8Tile::kTiny;
}

// The case's cache as FP8 rows (from the 16-bit rows of in.kv, which hold the same values in both
// element types, so the FP8 cache does not depend on t). Rows that hold data: tiles varied per
// fp8_tile_kind; rows no request may read (all NaN): as packed (NaN scales and bytes), or, every
// other one, scales 2^-8 with NaN bytes. Then the NaN byte of Case::fp8_nan_request.
inline std::vector<uint8_t> make_fp8_cache(const Case& c, const Inputs& in, DType t) {
  const size_t rows = static_cast<size_t>(in.num_pages) * c.page_size;
  std::vector<uint8_t> out(rows * kFp8RowBytes);
  Lcg rng;
  rng.s = 0x243F6A8885A308D3ull;  // its own stream: the 16-bit inputs stay those of the dense run
  std::vector<float> x(kHeadDimQK);
  for (size_t row = 0; row < rows; ++row) {
    for (int col = 0; col < kHeadDimQK; ++col) x[col] = from_bits(in.kv[row * kHeadDimQK + col], t);
    uint8_t* o = &out[row * kFp8RowBytes];
    pack_fp8_row(x.data(), o);
    const bool data = !std::isnan(x[0]);  // rows are all NaN or hold no NaN (make_inputs)
    for (int tile = 0; tile < kFp8Tiles; ++tile) {
      const uint32_t r = rng.next();
      if (!data) {
        if (r & 1) {
          set_fp8_scale(o, tile, std::ldexp(1.f, -8));  // a fast-path scale: only the bytes are NaN
        }
        continue;
      }
      uint8_t* bytes = o + tile * kFp8TileCols;
      const float scale = fp8_scale(o, tile);
      switch (fp8_tile_kind(r >> 8)) {
        case Fp8Tile::kPacked:
          break;
        case Fp8Tile::kRandomBytes:
          for (int i = 0; i < kFp8TileCols; ++i) {
            uint8_t b;
            do b = static_cast<uint8_t>(rng.next()); while ((b & 0x7F) == 0x7F);
            bytes[i] = b;
          }
          set_fp8_scale(o, tile, std::ldexp(1.f, -9));
          break;
        case Fp8Tile::kOddScale:
          set_fp8_scale(o, tile, scale * 1.5f);
          break;
        case Fp8Tile::kNegative:
          set_fp8_scale(o, tile, -scale);
          break;
        case Fp8Tile::kZero:
          set_fp8_scale(o, tile, 0.f);
          break;
        case Fp8Tile::kTiny:
          set_fp8_scale(o, tile, std::ldexp(1.f, -30));
          break;
      }
    }
  }
  if (c.fp8_nan_request >= 0) {
    const int page = in.table[static_cast<size_t>(c.fp8_nan_request) * in.max_pages + c.fp8_nan_token / c.page_size];
    uint8_t* o = &out[(static_cast<size_t>(page) * c.page_size + c.fp8_nan_token % c.page_size) * kFp8RowBytes];
    o[5] = 0x7F;
    set_fp8_scale(o, 0, std::ldexp(1.f, -8));
  }
  return out;
}

inline Inputs make_inputs(const Case& c, DType t, KvFormat format = KvFormat::kDense) {
  Inputs in;
  Lcg rng;
  in.num_pages = num_pages_of(c);
  in.max_pages = max_pages_of(c);
  const int rows = c.rows();
  in.q.resize(static_cast<size_t>(c.batch) * rows * kHeadDimQK);
  for (size_t i = 0; i < in.q.size(); ++i) {
    in.q[i] = to_bits(static_cast<int>(i % kHeadDimQK) < kHeadDimV ? rng.uniform() : rng.positive(), t);
  }
  in.kv.assign(static_cast<size_t>(in.num_pages) * c.page_size * kHeadDimQK, to_bits(NAN, t));
  // Pages in a shuffled order (Fisher-Yates with the LCG).
  std::vector<int32_t> ids(in.num_pages);
  for (int i = 0; i < in.num_pages; ++i) ids[i] = i;
  for (int i = in.num_pages - 1; i > 0; --i) std::swap(ids[i], ids[rng.next() % static_cast<uint32_t>(i + 1)]);
  in.table.assign(static_cast<size_t>(c.batch) * in.max_pages, -1);
  auto row_of = [&](int page, int token_in_page) {
    return (static_cast<size_t>(page) * c.page_size + token_in_page) * kHeadDimQK;
  };
  int next = 0;
  for (int r = 0; r < c.batch; ++r) {
    const int n = entries_of(c, r), own = pages_of(c, r);
    std::vector<bool> filled(own, false);
    for (int i = 0; i < n; ++i) {
      const int k = i == n - 1 ? own - 1 : i % std::max(own - 1, 1);  // which of the request's pages
      const int page = ids[next + k];
      in.table[static_cast<size_t>(r) * in.max_pages + i] = page;
      if (filled[k]) continue;  // a shared page: its rows were written for an earlier entry
      filled[k] = true;
      const int used = std::min(c.page_size, c.lens[r] - i * c.page_size);
      for (int row = 0; row < used; ++row) {
        for (int col = 0; col < kHeadDimQK; ++col) in.kv[row_of(page, row) + col] = to_bits(rng.uniform(), t);
      }
    }
    next += own;
  }
  for (const HotKey& h : c.hot) {
    if (h.request < 0) continue;
    const int page = in.table[static_cast<size_t>(h.request) * in.max_pages + h.token / c.page_size];
    for (int col = kHeadDimV; col < kHeadDimQK; ++col) in.kv[row_of(page, h.token % c.page_size) + col] = to_bits(h.rope, t);
  }
  if (c.bad_request >= 0) {
    in.table[static_cast<size_t>(c.bad_request) * in.max_pages + std::min(1, entries_of(c, c.bad_request) - 1)] =
        c.bad_past_end ? in.num_pages : -2;
  }
  in.lens.assign(c.lens, c.lens + c.batch);
  if (format == KvFormat::kFp8) in.kv_fp8 = make_fp8_cache(c, in, t);
  return in;
}

// The schedule the device's scheduler computes for the case (bit for bit: scheduler.h), which the
// self-check also checks on the device.
inline std::vector<int32_t> schedule_of(const Case& c) {
  std::vector<int32_t> s(static_cast<size_t>(schedule_size(c.batch, c.num_parts)));
  std::vector<int64_t> prefix(static_cast<size_t>(c.batch) + 1);
  plan_schedule_host(c.lens, c.batch, c.num_parts, prefix.data(), s.data());
  return s;
}

// ---- device memory ------------------------------------------------------------------------------

// Byte offsets of one case's buffers in the self-check's single allocation (256-byte aligned).
struct Layout {
  size_t q, kv, table, lens, out, lse, workspace, expired, total;
};

inline Layout layout_of(const Case& c) {
  Layout b;
  size_t off = 0;
  auto take = [&](size_t bytes) {
    const size_t at = off;
    off += (bytes + 255) / 256 * 256;
    return at;
  };
  const size_t rows = static_cast<size_t>(c.batch) * c.rows();
  b.q = take(rows * kHeadDimQK * 2);
  static_assert(kFp8RowBytes <= kHeadDimQK * 2, "the FP8 cache fits the 16-bit cache's buffer");
  b.kv = take(static_cast<size_t>(num_pages_of(c)) * c.page_size * kHeadDimQK * 2);
  b.table = take(static_cast<size_t>(c.batch) * max_pages_of(c) * 4);
  b.lens = take(static_cast<size_t>(c.batch) * 4);
  b.out = take(rows * kHeadDimV * 2);
  b.lse = take(rows * 4);
  b.workspace = take(static_cast<size_t>(workspace_layout(c.batch, c.rows(), c.num_parts).total_bytes));
  b.expired = take(4);
  b.total = off;
  return b;
}

// The self-check's allocation: the largest case's layout.
inline size_t device_bytes() {
  size_t m = 0;
  for (const Case& c : cases()) m = std::max(m, layout_of(c).total);
  return m;
}

}  // namespace jax_mla::self_check
