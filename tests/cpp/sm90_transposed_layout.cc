// Host unit test of the SM90 transposed kernel's index math (cuda/sm90/transposed_layout.h).
// Built and run by tests/test_sm90_transposed_layout.py with the host C++ compiler.
//
// The spot values are derived by hand from the layouts written in transposed_layout.h's header
// comment (the wgmma m64nNk16 accumulator layout of the PTX ISA with N = 16, and the TMA 128-byte
// swizzle), not computed with the functions under test. The loops then check that the mappings
// cover every element exactly once.
#include <cstdio>
#include <set>
#include <utility>

#include "sm90/transposed_layout.h"

using namespace jax_mla::sm90;

// Register of (i, q): q = 2 j + e -> 4 j + 2 i + e.
static_assert(t_acc(0, 0) == 0 && t_acc(0, 1) == 1 && t_acc(1, 0) == 2 && t_acc(1, 1) == 3);
static_assert(t_acc(0, 2) == 4 && t_acc(0, 3) == 5 && t_acc(1, 2) == 6 && t_acc(1, 3) == 7);
// ... and back, for every register of O^T's blocks (register 8 mb + r).
static_assert(t_slot_of(13) == 3 && t_mslot_of(13) == 0);  // r = 5 = 4 j + e with j = 1, e = 1, i = 0
static_assert(t_slot_of(30) == 2 && t_mslot_of(30) == 1);  // r = 6: j = 1, i = 1, e = 0
// Thread 37 (warp 1, lane 5): M = 16 + 1 = 17 (+8), query rows 2 (5 % 4) + {0, 1} = 2, 3 and 10, 11.
static_assert(t_m0(37) == 17);
static_assert(t_row(37, 0) == 2 && t_row(37, 1) == 3 && t_row(37, 2) == 10 && t_row(37, 3) == 11);
// Thread 127 (warp 3, lane 31): M = 48 + 7 = 55, rows 6, 7, 14, 15.
static_assert(t_m0(127) == 55 && t_row(127, 0) == 6 && t_row(127, 3) == 15);
// P offsets: row r at 128 r (in 1024-byte groups of 8 rows), 16-byte chunk c = 2 k / 16 at c ^ (r % 8).
static_assert(p_offset(0, 0) == 0);
static_assert(p_offset(0, 9) == 16 + 2);             // chunk 1 ^ 0 = 1
static_assert(p_offset(1, 0) == 128 + 16);           // chunk 0 ^ 1 = 1
static_assert(p_offset(3, 63) == 384 + 4 * 16 + 14);  // chunk 7 ^ 3 = 4, byte 14 of it
static_assert(p_offset(9, 8) == 1024 + 128 + 0);     // chunk 1 ^ 1 = 0
static_assert(p_offset(15, 0) == 1024 + 7 * 128 + 7 * 16);

int main() {
  int bad = 0;
  // S^T (64 keys x 16 rows): each element held by exactly one (thread, register).
  std::set<std::pair<int, int>> seen;
  for (int t = 0; t < 128; ++t) {
    std::set<int> regs;
    for (int i = 0; i < 2; ++i)
      for (int q = 0; q < 4; ++q) {
        regs.insert(t_acc(i, q));
        if (!seen.insert({t_m0(t) + 8 * i, t_row(t, q)}).second) ++bad;
      }
    if (regs.size() != 8) ++bad;
  }
  if (seen.size() != 64 * 16) ++bad;
  // O^T (512 columns x 16 rows): consumer c holds columns 256 c .. 256 c + 255 in its registers
  // k = 8 mb + t_acc(i, q), mb < 4 (kTRegsO = 32), as the kernel's epilogue writes them: every
  // element exactly once, and the inverse functions give back (i, q).
  std::set<std::pair<int, int>> out;
  for (int c = 0; c < 2; ++c)
    for (int t = 0; t < 128; ++t)
      for (int k = 0; k < 32; ++k) {
        const int i = t_mslot_of(k), q = t_slot_of(k);
        if (8 * (k / 8) + t_acc(i, q) != k) ++bad;
        if (!out.insert({256 * c + 64 * (k / 8) + t_m0(t) + 8 * i, t_row(t, q)}).second) ++bad;
      }
  if (out.size() != 512 * 16) ++bad;
  // P offsets: a bijection of (16 rows, 64 keys) onto the 2-byte slots of the 2 KB buffer, each
  // row inside its own 128 bytes.
  std::set<int> offs;
  for (int r = 0; r < 16; ++r)
    for (int k = 0; k < 64; ++k) {
      const int o = p_offset(r, k);
      if (o % 2 != 0 || o < r * 128 || o >= r * 128 + 128) ++bad;
      offs.insert(o);
    }
  if (offs.size() != 16 * 64) ++bad;
  std::printf("bad=%d\n", bad);
  if (bad != 0) return 1;
  std::printf("ok\n");
  return 0;
}
