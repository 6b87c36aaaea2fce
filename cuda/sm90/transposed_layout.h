// Index math of the SM90 transposed kernel (transposed_kernel.cuh), host- and device-callable so
// that tests/cpp/sm90_transposed_layout.cc can check it without a GPU.
//
// wgmma m64n16k16 accumulator (f32), per thread t of the warpgroup (warp w = t / 32, lane l):
// register 4 j + 2 i + e holds (M index 16 w + l / 4 + 8 i, N index 8 j + 2 (l % 4) + e), with
// i, j, e in {0, 1} (the m64nNk16 layout of wgmma.cuh with N = 16). In S^T, M is the key of the
// tile and N the query row; in each 64-column block mb of consumer c's O^T (registers
// 8 mb .. 8 mb + 7), M is the value column 256 c + 64 mb + M and N the query row. Query-row slot q = 2 j + e.
#pragma once

#include "../common/config.h"

namespace jax_mla::sm90 {

// Register of (M slot i, query-row slot q) in one m64n16 accumulator.
MLA_HOST_DEVICE constexpr int t_acc(int i, int q) { return 4 * (q >> 1) + 2 * i + (q & 1); }
// Query-row slot and M slot of register k of a consumer's O^T (32 registers: block k / 8).
MLA_HOST_DEVICE constexpr int t_slot_of(int k) { return ((k >> 2) & 1) * 2 + (k & 1); }
MLA_HOST_DEVICE constexpr int t_mslot_of(int k) { return (k >> 1) & 1; }
// M index of slot i = 0 for thread t (slot 1: + 8), and the query row of slot q.
MLA_HOST_DEVICE constexpr int t_m0(int thread) { return 16 * (thread / 32) + (thread % 32) / 4; }
MLA_HOST_DEVICE constexpr int t_row(int thread, int q) { return 8 * (q >> 1) + 2 * (thread % 4) + (q & 1); }

// Byte offset of the 16-bit P value (query row r, key k) in the consumer's (16, 64) P buffer: K-major
// with the 128-byte swizzle, the layout of a TMA box of 16 rows (and of store_p in softmax.cuh):
// 128-byte rows in 1024-byte groups of 8, the 16-byte chunk c of row r at chunk c ^ (r % 8).
MLA_HOST_DEVICE constexpr int p_offset(int r, int k) {
  return (r >> 3) * 1024 + (r & 7) * 128 + ((((k * 2) >> 4) ^ (r & 7)) << 4) + ((k * 2) & 15);
}

}  // namespace jax_mla::sm90
