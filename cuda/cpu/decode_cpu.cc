// CPU implementation of the split-KV MLA decode. See decode_cpu.h and docs/design.md.
//
// Work decomposition, identical to the GPU kernels so that both walk the same schedule:
//   task (p, m) = part p of the schedule x m-block m (query rows [m*kBlockM, (m+1)*kBlockM)).
// A task converts its query rows to fp32 once per piece and every KV token row once per KV
// block (an FP8 row is dequantized then: load_fp8_row), and reuses that token row for all of its
// query rows (rows of a request share KV).
#include "cpu/decode_cpu.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <system_error>
#include <vector>

#include "common/config.h"
#include "common/lse_merge.h"
#include "common/problem.h"
#include "common/scheduler.h"
#include "common/work_iterator.h"
#include "cpu/block_gemm.h"
#include "cpu/cpu_rows.h"

namespace jax_mla {
namespace {

using cpu::kBlockGemmTokenTile;
using cpu::e4m3_table;
using cpu::load_fp8_row;
using cpu::load_row;
using cpu::parallel_for;
using cpu::softmax_block_row;
using cpu::store_row;

// Per-thread buffers, allocated once per worker and reused by all of its tasks.
struct TaskScratch {
  std::vector<float> q;        // (kBlockM, 576) the task's query rows in fp32
  std::vector<float> kv;       // (kBlockN, 576) one KV block in fp32
  std::vector<float> acc;      // (kBlockM, 512) un-normalised output: sum_j exp(s_j - max) v_j
  std::vector<float> row_max;  // (kBlockM) running max of the scaled scores
  std::vector<float> row_sum;  // (kBlockM) running sum_j exp(s_j - max)
  std::vector<float> scores;   // (kBlockM, kBlockN) scaled scores, then probabilities, of one block
  std::vector<float> correction;  // (kBlockM) factor rescaling acc to the new running max
  std::vector<int> visible;    // (kBlockM) keys each row may see
  std::vector<int> visible_in_block;  // (kBlockM) of those, keys inside the current block

  TaskScratch()
      : q(static_cast<size_t>(kBlockM) * kHeadDimQK),
        kv(static_cast<size_t>(kBlockN) * kHeadDimQK),
        acc(static_cast<size_t>(kBlockM) * kHeadDimV),
        row_max(kBlockM),
        row_sum(kBlockM),
        scores(static_cast<size_t>(kBlockM) * kBlockN),
        correction(kBlockM),
        visible(kBlockM),
        visible_in_block(kBlockM) {}
};

class DecodeCpu {
 public:
  DecodeCpu(const DecodeProblem& p, bool baseline_gemm)
      : p_(p),
        q_(static_cast<const uint16_t*>(p.q)),
        kv_cache_(static_cast<const uint8_t*>(p.kv_cache)),
        kv_row_bytes_(p.kv_format == KvFormat::kFp8 ? kFp8RowBytes : kHeadDimQK * sizeof(uint16_t)),
        e4m3_(p.kv_format == KvFormat::kFp8 ? e4m3_table() : nullptr),
        out_(static_cast<uint16_t*>(p.out)),
        split_offsets_(p.schedule + split_offsets_begin(p.num_parts)),
        combine_(p.schedule + combine_begin(p.batch, p.num_parts)),
        num_m_blocks_((p.rows + kBlockM - 1) / kBlockM),
        gemm_(cpu::block_gemm(baseline_gemm)) {}

  int64_t num_tasks() const { return static_cast<int64_t>(p_.num_parts) * num_m_blocks_; }

  // Task t = (part t / num_m_blocks, m-block t % num_m_blocks).
  void run_task(int64_t task, TaskScratch& s) const {
    const int part = static_cast<int>(task / num_m_blocks_);
    const int m_block = static_cast<int>(task % num_m_blocks_);
    const int row0 = m_block * kBlockM;
    const int num_rows = std::min(kBlockM, p_.rows - row0);
    const PartWork work(p_.schedule, p_.num_parts, part, p_.seq_lens);
    work.for_each_piece([&](const PieceOfWork& piece, int) { run_piece(piece, row0, num_rows, s); });
  }

  // Requests the combine step visits: the schedule's combine list (num_splits != 1).
  int64_t num_listed() const { return combine_[kCombineCount]; }
  int listed_request(int64_t i) const { return combine_[kCombineHeader + i]; }

  // Merges the partial results of request r (num_splits >= 2), or writes the empty-request
  // result (num_splits == 0). Requests with one split were finished by their task.
  void combine_request(int r, std::vector<float>& merged) const {
    const int first_slot = split_offsets_[r];
    const int num_splits = split_offsets_[r + 1] - first_slot;
    if (num_splits == 1) return;
    merged.resize(kHeadDimV);  // (512)
    for (int row = 0; row < p_.rows; ++row) {
      const int64_t out_row = static_cast<int64_t>(r) * p_.rows + row;
      uint16_t* out = out_ + out_row * kHeadDimV;  // (512)
      if (num_splits == 0) {
        std::fill(merged.begin(), merged.end(), 0.f);
        store_row(p_.dtype, merged.data(), 1.f, kHeadDimV, out);
        p_.lse[out_row] = -INFINITY;
        continue;
      }
      // partial_lse (max_splits, rows): this row's splits are `rows` apart.
      const float* lse_parts = p_.partial_lse + static_cast<int64_t>(first_slot) * p_.rows + row;
      const RowWeights wt = row_weights_serial(lse_parts, num_splits, p_.rows);
      std::fill(merged.begin(), merged.end(), wt.bad ? NAN : 0.f);
      for (int split = 0; !wt.bad && split < num_splits; ++split) {
        // partial_out (max_splits, rows, 512)
        const float* o = p_.partial_out + (static_cast<int64_t>(first_slot + split) * p_.rows + row) * kHeadDimV;
        const float w = split_weight(wt, lse_parts[static_cast<int64_t>(split) * p_.rows]);
        for (int d = 0; d < kHeadDimV; ++d) merged[d] += w * o[d];
      }
      store_row(p_.dtype, merged.data(), 1.f, kHeadDimV, out);
      p_.lse[out_row] = merged_lse(wt);
    }
  }

 private:
  // Online softmax of rows [row0, row0 + num_rows) of request piece.request over the piece's
  // KV blocks, then the final or partial write-out.
  void run_piece(const PieceOfWork& piece, int row0, int num_rows, TaskScratch& s) const {
    const int r = piece.request;
    const int seq_len = p_.seq_lens[r];
    const int32_t* pages = p_.block_table + static_cast<int64_t>(r) * p_.max_pages;  // (max_pages)

    // Query rows of request r: q (b, s_q, h_q, 576) viewed as (b, rows, 576), row = t * h_q + h.
    const uint16_t* q_rows = q_ + (static_cast<int64_t>(r) * p_.rows + row0) * kHeadDimQK;
    int max_visible = 0;
    for (int i = 0; i < num_rows; ++i) {
      load_row(p_.dtype, q_rows + static_cast<int64_t>(i) * kHeadDimQK, kHeadDimQK, &s.q[i * kHeadDimQK]);
      const int t = (row0 + i) / p_.heads_q;
      s.visible[i] = std::min(visible_keys(seq_len, p_.seq_q, t, p_.causal), seq_len);
      max_visible = std::max(max_visible, s.visible[i]);
      s.row_max[i] = -INFINITY;
      s.row_sum[i] = 0.f;
    }
    std::fill(s.acc.begin(), s.acc.begin() + static_cast<int64_t>(num_rows) * kHeadDimV, 0.f);

    for (int block = piece.begin_block; block < piece.end_block; ++block) {
      const int token0 = block * kBlockN;
      // Tokens past what any row of the task may see are never loaded.
      const int token_end = std::min({token0 + kBlockN, seq_len, max_visible});
      if (token_end <= token0) break;  // later blocks are even further out
      const int num_tokens = token_end - token0;

      // KV block -> fp32, padded with zero rows to whole token tiles (their scores are ignored).
      const int padded_tokens = (num_tokens + kBlockGemmTokenTile - 1) / kBlockGemmTokenTile * kBlockGemmTokenTile;
      for (int j = 0; j < num_tokens; ++j) {
        // kv_cache (num_pages, page_size, row): token j lives in page block_table[r, j / page_size].
        const int token = token0 + j;
        const int64_t page = pages[token / p_.page_size];
        const uint8_t* kv_row = kv_cache_ + (page * p_.page_size + token % p_.page_size) * kv_row_bytes_;
        load_kv_row(kv_row, &s.kv[static_cast<int64_t>(j) * kHeadDimQK]);
      }
      std::fill(s.kv.begin() + static_cast<int64_t>(num_tokens) * kHeadDimQK,
                s.kv.begin() + static_cast<int64_t>(padded_tokens) * kHeadDimQK, 0.f);

      // S = Q K^T (scaled below).
      gemm_.qk(s.q.data(), num_rows, s.kv.data(), padded_tokens, s.scores.data());

      // Online softmax per row over its visible prefix of the block: S -> P = exp(S - max).
      for (int i = 0; i < num_rows; ++i) {
        const int n = std::min(token_end, s.visible[i]) - token0;  // keys row i sees in this block
        s.visible_in_block[i] = std::max(n, 0);
        if (n <= 0) continue;
        s.correction[i] = softmax_block_row(&s.scores[i * kBlockN], n, p_.softmax_scale, s.row_max[i], s.row_sum[i]);
      }

      // acc = acc * correction + P V for the rows that saw keys in this block.
      gemm_.pv(s.acc.data(), s.correction.data(), s.scores.data(), s.visible_in_block.data(), num_rows, s.kv.data());
    }

    for (int i = 0; i < num_rows; ++i) {
      const int row = row0 + i;
      const float* acc = &s.acc[static_cast<int64_t>(i) * kHeadDimV];
      // row_sum is >= 1 once a key was seen (the max key contributes exp(0)), NaN with NaN
      // data, and exactly 0 only when the row saw no key in this piece.
      const bool empty = s.row_sum[i] == 0.f;
      const float inv_sum = empty ? 0.f : 1.f / s.row_sum[i];
      const float lse = empty ? -INFINITY : s.row_max[i] + std::log(s.row_sum[i]);
      if (piece.num_splits == 1) {
        const int64_t out_row = static_cast<int64_t>(r) * p_.rows + row;
        store_row(p_.dtype, acc, inv_sum, kHeadDimV, out_ + out_row * kHeadDimV);  // out (b, rows, 512)
        p_.lse[out_row] = lse;                                                        // lse (b, rows)
      } else {
        const int64_t slot_row = static_cast<int64_t>(piece.slot) * p_.rows + row;
        float* partial = p_.partial_out + slot_row * kHeadDimV;  // partial_out (max_splits, rows, 512)
        for (int d = 0; d < kHeadDimV; ++d) partial[d] = acc[d] * inv_sum;
        p_.partial_lse[slot_row] = lse;  // partial_lse (max_splits, rows)
      }
    }
  }

  // One cache row (kv_row_bytes_ bytes) -> its 576 values in fp32. The format only changes how a
  // row becomes fp32; everything after (products, softmax, merge) is the same for both.
  void load_kv_row(const uint8_t* row, float* dst) const {
    if (e4m3_ != nullptr) {
      load_fp8_row(row, e4m3_, dst);
    } else {
      load_row(p_.dtype, reinterpret_cast<const uint16_t*>(row), kHeadDimQK, dst);
    }
  }

  const DecodeProblem& p_;
  const uint16_t* q_;               // (b, rows, 576)
  const uint8_t* kv_cache_;         // (num_pages, page_size, kv_row_bytes_)
  int64_t kv_row_bytes_;            // 576 16-bit values, or kFp8RowBytes (KvFormat::kFp8)
  const float* e4m3_;               // (256) float(e4m3) of each byte when kFp8, else null
  uint16_t* out_;                   // (b, rows, 512)
  const int32_t* split_offsets_;    // (b + 1)
  const int32_t* combine_;          // (kCombineHeader + b) combine list, scheduler.h
  int num_m_blocks_;
  const cpu::BlockGemm& gemm_;
};

}  // namespace

void decode_cpu(const DecodeProblem& params, bool baseline_gemm, int max_threads) {
  const int num_threads = cpu::thread_count(max_threads);
  const DecodeCpu decode(params, baseline_gemm);

  parallel_for<TaskScratch>(decode.num_tasks(), num_threads,
                            [&](int64_t task, TaskScratch& s) { decode.run_task(task, s); });

  // The combine moves rows * 512 floats per split: only worth threads for large batches.
  const int64_t splits_used = params.schedule[split_offsets_begin(params.num_parts) + params.batch];
  const int64_t combine_floats = splits_used * params.rows * kHeadDimV;
  const int combine_threads = combine_floats >= (int64_t{1} << 20) ? num_threads : 1;
  // Only the listed requests (the schedule is the host plan, checked by the handler).
  parallel_for<std::vector<float>>(decode.num_listed(), combine_threads,
                                   [&](int64_t i, std::vector<float>& merged) {
                                     decode.combine_request(decode.listed_request(i), merged);
                                   });
}

}  // namespace jax_mla
