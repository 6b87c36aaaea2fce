// Building blocks the CPU kernels share (decode_cpu.cc, sparse_cpu.cc): a cache or query row to
// fp32 (16-bit floats, or a 656-byte FP8 row dequantized exactly as jax_mla.unpack_fp8_kv), an
// output row back to 16 bits, and the thread pool loop.
#pragma once

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <system_error>
#include <thread>
#include <vector>

#include "common/config.h"
#include "common/problem.h"
#include "cpu/decode_cpu.h"

namespace jax_mla {
namespace cpu {

// Converts `count` 16-bit floats to fp32.
inline void load_row(DType dtype, const uint16_t* src, int count, float* dst) {
  if (dtype == DType::kBF16) {
    for (int i = 0; i < count; ++i) dst[i] = bf16_to_float(src[i]);
  } else {
    for (int i = 0; i < count; ++i) dst[i] = fp16_to_float(src[i]);
  }
}

// Writes src * scale as 16-bit floats.
inline void store_row(DType dtype, const float* src, float scale, int count, uint16_t* dst) {
  if (dtype == DType::kBF16) {
    for (int i = 0; i < count; ++i) dst[i] = float_to_bf16(src[i] * scale);
  } else {
    for (int i = 0; i < count; ++i) dst[i] = float_to_fp16(src[i] * scale);
  }
}

// float(e4m3) of every byte value: one table lookup per FP8 latent value.
struct E4m3Table {
  float value[256];
  E4m3Table() {
    for (int i = 0; i < 256; ++i) value[i] = fp8_e4m3_to_float(static_cast<uint8_t>(i));
  }
};

inline const float* e4m3_table() {
  static const E4m3Table table;
  return table.value;
}

// One 656-byte FP8 row (common/config.h) -> its 576 values in fp32, the values
// jax_mla.unpack_fp8_kv(row, float32) gives: latent = float(e4m3) * scale as one fp32 product
// (exact for the power-of-two scales pack_fp8_kv writes; any other scale rounds as unpack's does),
// RoPE = the stored bf16 values (exact in fp32). Only called for rows below seq_len, so the
// scales of unused rows (often garbage or NaN) are never read.
inline void load_fp8_row(const uint8_t* row, const float* e4m3, float* dst) {
  for (int tile = 0; tile < kFp8Tiles; ++tile) {
    float scale;
    std::memcpy(&scale, row + kFp8ScalesOffset + 4 * tile, sizeof(scale));  // little-endian host
    const uint8_t* v = row + tile * kFp8TileCols;
    float* d = dst + tile * kFp8TileCols;
    for (int i = 0; i < kFp8TileCols; ++i) d[i] = e4m3[v[i]] * scale;
  }
  for (int i = 0; i < kHeadDimRope; ++i) {
    uint16_t h;
    std::memcpy(&h, row + kFp8RopeOffset + 2 * i, sizeof(h));  // 2-byte aligned only
    dst[kHeadDimV + i] = bf16_to_float(h);
  }
}

// One query row's online-softmax step over the n raw scores q . k of a KV block: score[j] becomes
// exp(scale * score[j] - new_max), row_max / row_sum are updated, and the factor rescaling the
// row's accumulator to the new max is returned (0 for the row's first key).
inline float softmax_block_row(float* score, int n, float scale, float& row_max, float& row_sum) {
  float block_max = -INFINITY;
  for (int j = 0; j < n; ++j) {
    score[j] *= scale;
    // NaN never becomes the max; it still poisons the sums below, as NaN data should.
    block_max = score[j] > block_max ? score[j] : block_max;
  }
  const float new_max = std::max(row_max, block_max);
  float block_sum = 0.f;
  for (int j = 0; j < n; ++j) {
    score[j] = std::exp(score[j] - new_max);
    block_sum += score[j];
  }
  const float correction = std::exp(row_max - new_max);
  row_max = new_max;
  row_sum = row_sum * correction + block_sum;
  return correction;
}

// The worker count of a CPU call: max_threads when positive (JAX_MLA_CPU_THREADS), else every
// hardware thread, at least one.
inline int thread_count(int max_threads) {
  const int n = max_threads > 0 ? max_threads : static_cast<int>(std::thread::hardware_concurrency());
  return std::max(n, 1);
}

// Runs body(item, worker_state) for item in [0, num_items) on up to num_threads threads
// (the calling thread included), handing out items through an atomic counter. The per-thread
// states are allocated up front on the calling thread, so an allocation failure surfaces there
// (as std::bad_alloc, before any thread starts) rather than inside a worker.
template <typename State, typename Body>
inline void parallel_for(int64_t num_items, int num_threads, Body body) {
  const int workers = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(num_threads, num_items)));
  std::vector<State> states(workers);
  std::atomic<int64_t> next{0};
  auto work = [&](State& state) {
    for (int64_t item = next.fetch_add(1); item < num_items; item = next.fetch_add(1)) body(item, state);
  };
  std::vector<std::thread> threads;
  threads.reserve(workers - 1);
  for (int w = 1; w < workers; ++w) {
    try {
      threads.emplace_back(work, std::ref(states[w]));
    } catch (const std::system_error&) {
      break;  // no more threads available: the running ones (this one included) take the rest
    }
  }
  work(states[0]);
  for (std::thread& t : threads) t.join();
}


}  // namespace cpu
}  // namespace jax_mla
