// CPU implementation of the sparse MLA decode. See sparse_cpu.h and docs/design.md ("Sparse decode").
//
// Task = (request r, query token t, block of kBlockM heads): the heads of one token share its
// selected slots, so a task gathers kBlockN valid slots at a time into an fp32 block (the
// decode kernel's row loads), and runs the decode kernel's block products and online softmax on it.
#include "cpu/sparse_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "common/config.h"
#include "cpu/block_gemm.h"
#include "cpu/cpu_rows.h"

namespace jax_mla {
namespace {

using cpu::kBlockGemmTokenTile;

struct SparseScratch {
  std::vector<float> q, kv, acc, row_max, row_sum, scores, correction;
  std::vector<int> visible;
  SparseScratch()
      : q(static_cast<size_t>(kBlockM) * kHeadDimQK),
        kv(static_cast<size_t>(kBlockN) * kHeadDimQK),
        acc(static_cast<size_t>(kBlockM) * kHeadDimV),
        row_max(kBlockM),
        row_sum(kBlockM),
        scores(static_cast<size_t>(kBlockM) * kBlockN),
        correction(kBlockM),
        visible(kBlockM) {}
};

class SparseCpu {
 public:
  SparseCpu(const SparseProblem& p, bool baseline_gemm)
      : p_(p),
        kv_row_bytes_(p.kv_format == KvFormat::kFp8 ? kFp8RowBytes : kHeadDimQK * sizeof(uint16_t)),
        e4m3_(p.kv_format == KvFormat::kFp8 ? cpu::e4m3_table() : nullptr),
        head_blocks_((p.heads_q + kBlockM - 1) / kBlockM),
        gemm_(cpu::block_gemm(baseline_gemm)) {}

  int64_t num_tasks() const { return static_cast<int64_t>(p_.batch) * p_.seq_q * head_blocks_; }

  void run_task(int64_t task, SparseScratch& s) const {
    const int64_t token_row = task / head_blocks_;  // r * s_q + t
    const int r = static_cast<int>(token_row / p_.seq_q);
    const int h0 = static_cast<int>(task % head_blocks_) * kBlockM;
    const int num_rows = std::min(kBlockM, p_.heads_q - h0);
    const int32_t* idx = p_.indices + token_row * p_.topk;  // (topk)
    const int count = sparse_count(p_, r);
    const uint8_t* cache = static_cast<const uint8_t*>(p_.kv_cache);

    // q (b, s_q, h_q, 576): rows h0.. of token (r, t).
    const uint16_t* q_rows = static_cast<const uint16_t*>(p_.q) + (token_row * p_.heads_q + h0) * kHeadDimQK;
    for (int i = 0; i < num_rows; ++i) {
      cpu::load_row(p_.dtype, q_rows + static_cast<int64_t>(i) * kHeadDimQK, kHeadDimQK, &s.q[i * kHeadDimQK]);
      s.row_max[i] = -INFINITY;
      s.row_sum[i] = 0.f;
    }
    std::fill(s.acc.begin(), s.acc.begin() + static_cast<int64_t>(num_rows) * kHeadDimV, 0.f);

    int k = 0;
    while (k < count) {
      // Gather the next (up to) kBlockN valid slots, duplicates included, skipping -1.
      int n = 0;
      for (; k < count && n < kBlockN; ++k) {
        const int32_t slot = idx[k];
        if (slot < 0) continue;
        load_kv_row(cache + static_cast<int64_t>(slot) * kv_row_bytes_, &s.kv[static_cast<int64_t>(n) * kHeadDimQK]);
        ++n;
      }
      if (n == 0) break;
      const int padded = (n + kBlockGemmTokenTile - 1) / kBlockGemmTokenTile * kBlockGemmTokenTile;
      std::fill(s.kv.begin() + static_cast<int64_t>(n) * kHeadDimQK,
                s.kv.begin() + static_cast<int64_t>(padded) * kHeadDimQK, 0.f);
      gemm_.qk(s.q.data(), num_rows, s.kv.data(), padded, s.scores.data());
      for (int i = 0; i < num_rows; ++i) {
        s.visible[i] = n;
        s.correction[i] = cpu::softmax_block_row(&s.scores[i * kBlockN], n, p_.softmax_scale, s.row_max[i], s.row_sum[i]);
      }
      gemm_.pv(s.acc.data(), s.correction.data(), s.scores.data(), s.visible.data(), num_rows, s.kv.data());
    }

    uint16_t* out = static_cast<uint16_t*>(p_.out);
    for (int i = 0; i < num_rows; ++i) {
      const int h = h0 + i;
      const int64_t out_row = token_row * p_.heads_q + h;  // (b, s_q, h_q)
      const bool empty = s.row_sum[i] == 0.f;
      const float lse = empty ? -INFINITY : s.row_max[i] + std::log(s.row_sum[i]);
      float scale = empty ? 0.f : 1.f / s.row_sum[i];
      if (!empty && p_.attn_sink != nullptr) {
        scale /= attn_sink_divisor(p_.attn_sink[sink_index(p_.sink_per_request, p_.heads_q, r, h)], lse);
      }
      cpu::store_row(p_.dtype, &s.acc[static_cast<int64_t>(i) * kHeadDimV], scale, kHeadDimV,
                     out + out_row * kHeadDimV);
      p_.lse[out_row] = lse;
    }
  }

 private:
  void load_kv_row(const uint8_t* row, float* dst) const {
    if (e4m3_ != nullptr) {
      cpu::load_fp8_row(row, e4m3_, dst);
    } else {
      cpu::load_row(p_.dtype, reinterpret_cast<const uint16_t*>(row), kHeadDimQK, dst);
    }
  }

  const SparseProblem& p_;
  int64_t kv_row_bytes_;
  const float* e4m3_;
  int head_blocks_;
  const cpu::BlockGemm& gemm_;
};

}  // namespace

void decode_sparse_cpu(const SparseProblem& p, bool baseline_gemm, int max_threads) {
  const int num_threads = cpu::thread_count(max_threads);
  const SparseCpu sparse(p, baseline_gemm);
  cpu::parallel_for<SparseScratch>(sparse.num_tasks(), num_threads,
                                   [&](int64_t task, SparseScratch& s) { sparse.run_task(task, s); });
}

}  // namespace jax_mla
