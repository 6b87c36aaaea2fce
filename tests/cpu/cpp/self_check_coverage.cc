// Host test of the self-check's coverage (cuda/runtime/self_check_cases.h): builds every case's
// inputs and schedule exactly as the self-check does, walks each CTA's pieces as the GPU kernels do
// (common/work_iterator.h) and models the lazy rescale of the SM90 / SM100 softmax on the exact
// scores, then prints, for every kernel path it knows, the cases that reach it:
//     path <name>: <case> <case> ...
// plus a few numbers (device bytes, the smallest rescale margin). tests/cpu/test_self_check_coverage.py
// asserts that every path it requires has a case. The model of the rescale: a row's reference max
// (log2 units, scale * log2 e folded in) moves only when a tile's max over the row's visible keys
// exceeds it by more than kLazyRescaleSlack (sm100/softmax.cuh step 4, sm90/softmax.cuh
// move_reference); on a tile after a piece's first, that is a rescale of O (sm100/correction.cuh
// rescale_o, the TMEM load / store path; sm90 rescale_o).
//
// The FP8 cache (the cases over it, for a candidate that reads it: self_check_cases.h kv_formats;
// Case::fp8_only cases run over it alone): paths prefixed "fp8_". The model of the dequantizing warps (sm100/fp8_tiles.cuh, sm90/fp8_tiles.cuh):
// a tile's rows as TMA lands them (a page chunk whose first token is past the length comes from past
// the cache's end: zeros), cut into steps of kFp8RowsPerStep whole rows (all four pairs), the warp
// vote's unit (common/fp8_tile.cuh dequantize_tile); a step takes the fast path iff every row's scale passes fp8_fast_factor for the element type and no
// byte is NaN (common/fp8_convert.cuh, the kernels' own predicate). The rescale model runs on the
// dequantized values (the exact fp32 products).
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/fp8_convert.cuh"
#include "common/problem.h"
#include "common/work_iterator.h"
#include "runtime/kernel_select.h"
#include "runtime/self_check_cases.h"

using namespace jax_mla;
using namespace jax_mla::self_check;

namespace {

std::map<std::string, std::set<std::string>> hits;  // path -> cases
// A case that runs over the FP8 cache only (Case::fp8_only) reaches only the "fp8_" paths.
void hit(const std::string& path, const Case& c) {
  if (!runs_in(c, KvFormat::kDense) && path.rfind("fp8_", 0) != 0) return;
  hits[path].insert(c.name);
}

int failures = 0;
void fail(const std::string& what) {
  std::printf("FAIL %s\n", what.c_str());
  ++failures;
}

// Walks the CTAs of a case: (part, row block) -> its pieces.
void cover_schedule(const Case& c, const std::vector<int32_t>& schedule) {
  std::set<int> requests_seen;
  for (int part = 0; part < c.num_parts; ++part) {
    const PartWork work(schedule.data(), c.num_parts, part, c.lens);
    int pieces = 0, events = 0, tiles = 0;
    bool split = false, whole = false, bad = false, good = false;
    std::printf("case %s part %d:", c.name, part);
    work.for_each_piece([&](const PieceOfWork& w, int) {
      const int n = w.end_block - w.begin_block;
      std::printf(" r%d[%d,%d)%s", w.request, w.begin_block, w.end_block, w.num_splits > 1 ? "s" : "");
      ++pieces;
      tiles += n;
      events += n - 1;  // tiles after a piece's first: alpha events (sm100 alpha_full)
      hit(n == 1 ? "piece_of_1_tile" : n == 2 ? "piece_of_2_tiles" : "piece_of_3+_tiles", c);
      if (n >= 128) hit("piece_of_128+_tiles", c);
      (w.num_splits > 1 ? split : whole) = true;
      (w.request == c.bad_request ? bad : good) = true;
      requests_seen.insert(w.request);
      if (w.num_splits > 1) hit("split_request_piece", c);
    });
    std::printf("\n");
    if (pieces >= 2) hit("cta_pieces>=2 (q_empty reuse, per-piece o_ready)", c);
    if (pieces >= 3) hit("cta_pieces>=3 (stats_full second phase)", c);
    if (events >= 3) hit("cta_alpha_events>=3 (alpha slot second phase)", c);
    if (tiles > 2 * 2) hit("cta_tiles>4 (KV ring phases wrap)", c);
    if (split && whole) hit("cta_split_and_whole_pieces", c);
    if (bad && good) hit("cta_bad_and_good_pieces", c);
  }
  for (int r = 0; r < c.batch; ++r) {
    if (c.lens[r] > 0 && !requests_seen.count(r)) fail(std::string(c.name) + ": request without a piece");
  }
}

// Scores of the case in float64 on the exact inputs, reference moves per the lazy rule. key(row, col):
// the value of column col of cache row `row` (page * page_size + token in page); paths get `prefix`.
template <typename Key>
void cover_rescale(const Case& c, KvFormat f, const Inputs& in, const std::vector<int32_t>& schedule,
                   double* min_margin, const Key& key, const std::string& prefix) {
  const double scale_log2 = static_cast<double>(kSoftmaxScale) * 1.4426950408889634;
  const int rows = c.rows();
  for (int part = 0; part < c.num_parts; ++part) {
    const PartWork work(schedule.data(), c.num_parts, part, c.lens);
    for (int mb = 0; mb < num_row_blocks(rows); ++mb) {
      int events = 0;  // the CTA's alpha events so far (slot events % 2)
      work.for_each_piece([&](const PieceOfWork& w, int) {
        const int r = w.request;
        const bool bad = nan_request(c, f, r);
        for (int row = mb * kBlockM; row < std::min(rows, mb * kBlockM + kBlockM); ++row) {
          if (bad) break;
          const int visible = visible_keys(c.lens[r], c.seq_q, row / c.heads_q, c.causal);
          const uint16_t* q = &in.q[(static_cast<size_t>(r) * rows + row) * kHeadDimQK];
          double m_ref = -INFINITY;
          for (int blk = w.begin_block; blk < w.end_block; ++blk) {
            double m_tile = -INFINITY;
            for (int k = blk * kBlockN; k < std::min(visible, blk * kBlockN + kBlockN); ++k) {
              const int page = in.table[static_cast<size_t>(r) * in.max_pages + k / c.page_size];
              const size_t cache_row = static_cast<size_t>(page) * c.page_size + k % c.page_size;
              double s = 0;
              for (int col = 0; col < kHeadDimQK; ++col) {
                s += static_cast<double>(from_bits(q[col], DType::kBF16)) * key(cache_row, col);
              }
              m_tile = std::max(m_tile, s * scale_log2);
            }
            if (m_tile > m_ref + kLazyRescaleSlack) {
              if (blk > w.begin_block) {
                const int ev = events + (blk - w.begin_block - 1);
                hit(prefix + (ev % 2 == 0 ? "rescale_alpha_slot_0" : "rescale_alpha_slot_1"), c);
                hit(prefix + "rescale", c);
                if (mb > 0) hit(prefix + "rescale_row_block_1", c);
                *min_margin = std::min(*min_margin, m_tile - m_ref - kLazyRescaleSlack);
              }
              m_ref = m_tile;
            } else if (blk > w.begin_block && m_tile > m_ref + kLazyRescaleSlack - 1) {
              fail(prefix + c.name + ": a tile max within 1 of the slack (float rounding could decide it)");
            }
          }
        }
        events += w.end_block - w.begin_block - 1;
      });
    }
  }
}

bool has_nan_byte(const uint8_t* bytes, int n) {
  for (int i = 0; i + 4 <= n; i += 4) {
    uint32_t w;
    std::memcpy(&w, bytes + i, 4);
    if (e4m3_nan_bytes(w) != 0) return true;
  }
  return false;
}

uint32_t scale_bits_of(const uint8_t* row, int tile) {
  uint32_t u;
  std::memcpy(&u, row + kFp8ScalesOffset + 4 * tile, 4);
  return u;
}

// The dequantizing warps' steps over every tile a request reads (the tile walk of work_iterator.h:
// each tile of a request once per row block; the rows are the same for every row block).
void cover_fp8_steps(const Case& c, const Inputs& in) {
  static const uint8_t kZeroRow[kFp8RowBytes] = {};
  const int box_rows = std::min(c.page_size, kBlockN);
  for (int r = 0; r < c.batch; ++r) {
    const int len = c.lens[r];
    for (int blk = 0; blk * kBlockN < len; ++blk) {
      const uint8_t* rows[kBlockN];
      bool read[kBlockN];
      bool oob = false;
      for (int i = 0; i < kBlockN; ++i) {
        const int token = blk * kBlockN + i;
        const int chunk_first = blk * kBlockN + i / box_rows * box_rows;  // locate_tile: one copy per chunk
        read[i] = token < len;
        rows[i] = kZeroRow;  // past the cache's end (TMA zero fill), or a bad page id's chunk
        if (chunk_first < len) {
          const int page = in.table[static_cast<size_t>(r) * in.max_pages + token / c.page_size];
          if (page >= 0 && page < in.num_pages) {
            rows[i] = &in.kv_fp8[(static_cast<size_t>(page) * c.page_size + token % c.page_size) * kFp8RowBytes];
          }
        } else {
          oob = true;
        }
        if (read[i] && !nan_request(c, KvFormat::kFp8, r)) {
          for (int t = 0; t < kFp8Tiles; ++t) {
            if (std::isnan(bits_float(scale_bits_of(rows[i], t))) ||
                has_nan_byte(rows[i] + t * kFp8TileCols, kFp8TileCols)) {
              fail(std::string(c.name) + ": an FP8 row a good request reads holds NaN");
            }
          }
        }
        if (!read[i] && rows[i] != kZeroRow) {  // a dead row loaded with the tile
          for (int t = 0; t < kFp8Tiles; ++t) {
            const uint32_t sb = scale_bits_of(rows[i], t);
            if (std::isnan(bits_float(sb))) hit("fp8_dead_row_nan_scale", c);
            uint32_t f;
            if (fp8_fast_factor<Bf16Format>(sb, &f) && has_nan_byte(rows[i] + t * kFp8TileCols, kFp8TileCols)) {
              hit("fp8_dead_row_nan_bytes_under_a_fast_scale", c);
            }
          }
        }
      }
      if (oob) hit("fp8_rows_past_the_cache_end (zero-filled)", c);
      for (int g = 0; g < kBlockN / kFp8RowsPerStep; ++g) {
        bool any_read = false, fast_bf = true, fast_h = true, dead_nan = false;
        for (int pair = 0; pair < kFp8Tiles; ++pair) {
          for (int i = kFp8RowsPerStep * g; i < kFp8RowsPerStep * (g + 1); ++i) {
            const uint32_t sb = scale_bits_of(rows[i], pair);
            const bool nan_bytes = has_nan_byte(rows[i] + pair * kFp8TileCols, kFp8TileCols);
            uint32_t f;
            const bool row_bf = fp8_fast_factor<Bf16Format>(sb, &f) && !nan_bytes;
            const bool row_h = fp8_fast_factor<Fp16Format>(sb, &f) && !nan_bytes;
            fast_bf &= row_bf;
            fast_h &= row_h;
            any_read |= read[i];
            if (!read[i] && (nan_bytes || std::isnan(bits_float(sb)))) dead_nan = true;
            if (!read[i]) continue;
            if (nan_bytes) {
              hit("fp8_nan_byte_in_read_row", c);
              if (!nan_request(c, KvFormat::kFp8, r)) {
                fail(std::string(c.name) + ": a NaN byte outside the NaN request");
              }
            }
            if ((sb & 0x7FFFFFu) != 0 && std::isfinite(bits_float(sb))) hit("fp8_reference_step_odd_scale", c);
            if (row_bf && !row_h) hit("fp8_reference_step_scale_outside_float16_range (fast in bfloat16)", c);
            if (row_bf && row_h) {
              if ((sb & 0x7FFFFFFFu) == 0) hit("fp8_zero_scale_fast", c);
              if ((sb & 0x80000000u) != 0 && (sb & 0x7FFFFFFFu) != 0) hit("fp8_negative_scale_fast", c);
              for (int b = 0; b < kFp8TileCols; ++b) {
                const uint8_t v = rows[i][pair * kFp8TileCols + b];
                if ((v & 0x78) == 0 && (v & 7) != 0) {
                  hit("fp8_subnormal_e4m3_fast", c);
                  break;
                }
              }
            }
          }
        }
        if (!any_read) continue;
        if (fast_bf) hit("fp8_fast_step_bfloat16", c);
        if (fast_h) hit("fp8_fast_step_float16", c);
        if (!fast_bf) hit("fp8_reference_step_bfloat16", c);
        if (!fast_h) hit("fp8_reference_step_float16", c);
        if (dead_nan) hit("fp8_reference_step_for_a_dead_row's_NaN", c);
      }
    }
  }
  if (c.fp8_nan_request >= 0) {
    const int r = c.fp8_nan_request;
    if (r == c.bad_request || c.fp8_nan_token >= c.lens[r]) fail(std::string(c.name) + ": the NaN byte is not read");
    for (int t = 0; t < c.seq_q; ++t) {
      if (visible_keys(c.lens[r], c.seq_q, t, c.causal) <= c.fp8_nan_token) {
        fail(std::string(c.name) + ": a query row of the NaN request does not see its NaN byte");
      }
    }
  }
}

}  // namespace

int main() {
  double min_margin = INFINITY;
  for (const Case& c : cases()) {
    const std::vector<int32_t> schedule = schedule_of(c);
    cover_schedule(c, schedule);
    const Inputs bf = make_inputs(c, DType::kBF16), hf = make_inputs(c, DType::kF16);
    // Both element types hold the same values (exact conversions), so one model covers both.
    for (size_t i = 0; i < bf.q.size(); ++i) {
      if (from_bits(bf.q[i], DType::kBF16) != from_bits(hf.q[i], DType::kF16)) {
        fail(std::string(c.name) + ": q differs between bf16 and fp16");
        break;
      }
    }
    for (size_t i = 0; i < bf.kv.size(); ++i) {
      const float a = from_bits(bf.kv[i], DType::kBF16), b = from_bits(hf.kv[i], DType::kF16);
      if (!(a == b || (std::isnan(a) && std::isnan(b)))) {
        fail(std::string(c.name) + ": kv differs between bf16 and fp16");
        break;
      }
    }
    if (bf.table != hf.table) fail(std::string(c.name) + ": block tables differ between dtypes");
    cover_rescale(
        c, KvFormat::kDense, bf, schedule, &min_margin,
        [&](size_t row, int col) { return double{from_bits(bf.kv[row * kHeadDimQK + col], DType::kBF16)}; },
        "");
    // The FP8 cases: those the self-check runs for the SM100 candidate (and any candidate reading FP8).
    for (KvFormat f : kv_formats(reads_fp8_cache(Kernel::kSm100))) {
      if (f != KvFormat::kFp8) continue;
      const Inputs bf8 = make_inputs(c, DType::kBF16, f), hf8 = make_inputs(c, DType::kF16, f);
      if (bf8.kv_fp8 != hf8.kv_fp8) fail(std::string(c.name) + ": the FP8 cache differs between dtypes");
      if (bf8.kv != bf.kv || bf8.q != bf.q || bf8.table != bf.table) {
        fail(std::string(c.name) + ": the FP8 run's 16-bit inputs differ from the dense run's");
      }
      if (bf8.kv_fp8.size() > layout_of(c).table - layout_of(c).kv) fail(std::string(c.name) + ": FP8 cache overflows");
      cover_rescale(
          c, f, bf8, schedule, &min_margin,
          [&](size_t row, int col) { return double{fp8_row_value(&bf8.kv_fp8[row * kFp8RowBytes], col)}; },
          "fp8_");
      cover_fp8_steps(c, bf8);
      hit("fp8_page_" + std::to_string(c.page_size), c);
      for (DType t : kDTypes) hit(std::string("fp8_dtype_") + dtype_name(t), c);
      if (c.bad_request >= 0) hit("fp8_bad_page_id", c);
    }

    hit("rows_" + std::to_string(c.rows()), c);
    if (c.rows() < kBlockM) hit("padding_rows", c);
    if (c.rows() > kBlockM) hit("two_row_blocks", c);
    hit("s_q_" + std::to_string(c.seq_q) + (c.causal ? "_causal" : "_noncausal"), c);
    hit("heads_" + std::to_string(c.heads_q), c);
    hit("page_" + std::to_string(c.page_size), c);
    int longest = 0;
    for (int r = 0; r < c.batch; ++r) {
      const int len = c.lens[r];
      longest = std::max(longest, len);
      if (len == 0) hit("empty_request", c);
      if (len > 0 && len % kBlockN != 0) hit("tail_tile", c);
      if (len > 0 && len % kBlockN == 0) hit("whole_last_tile", c);
      if (c.causal && len > 0 && len < c.seq_q) hit("rows_without_visible_key", c);
      if (len > c.page_size && len % c.page_size != 0) hit("page_boundary_inside_request", c);
    }
    if (longest >= 16384) hit("context>=16K", c);
    if (c.bad_request >= 0) {
      const int entry = std::min(1, entries_of(c, c.bad_request) - 1);
      const int id = bf.table[static_cast<size_t>(c.bad_request) * bf.max_pages + entry];
      if (entry * c.page_size >= c.lens[c.bad_request] || (id >= 0 && id < bf.num_pages)) {
        fail(std::string(c.name) + ": the bad page id is not read or not bad");
      }
      hit(id < 0 ? "bad_page_id_negative" : "bad_page_id_past_end", c);
    }
    // Every block-table entry a request reads is valid except the bad one; past its entries, -1.
    for (int r = 0; r < c.batch; ++r) {
      for (int i = 0; i < bf.max_pages; ++i) {
        const int id = bf.table[static_cast<size_t>(r) * bf.max_pages + i];
        const bool read = i < entries_of(c, r);
        const bool valid = id >= 0 && id < bf.num_pages;
        if (read && !valid && r != c.bad_request) fail(std::string(c.name) + ": an invalid id a good request reads");
        if (!read && valid) fail(std::string(c.name) + ": a valid id past a request's pages");
      }
    }
    for (const HotKey& h : c.hot) {
      if (h.request < 0) continue;
      if (c.shared_pages > 0 && h.token / c.page_size != entries_of(c, h.request) - 1) {
        fail(std::string(c.name) + ": a hot key on a shared page would repeat");
      }
    }
    for (DType t : kDTypes) hit(std::string("dtype_") + dtype_name(t), c);
    std::printf("case %s bytes %zu\n", c.name, layout_of(c).total);
  }
  for (const auto& [path, names] : hits) {
    std::printf("path %s:", path.c_str());
    for (const std::string& n : names) std::printf(" %s", n.c_str());
    std::printf("\n");
  }
  for (Kernel k : {Kernel::kSm90, Kernel::kSm100}) {
    std::printf("self_check_formats %s:", kernel_name(k));
    for (KvFormat f : kv_formats(reads_fp8_cache(k))) std::printf(" %s", format_name(f));
    std::printf("\nreads_fp8 %s %d\n", kernel_name(k), reads_fp8_cache(k) ? 1 : 0);
  }
  std::printf("device_bytes %zu\n", device_bytes());
  std::printf("min_rescale_margin %.3f\n", min_margin);
  std::printf(failures ? "failed\n" : "ok\n");
  return failures ? 1 : 0;
}
