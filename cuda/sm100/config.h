// Compile-time configuration of the SM100 (B200/GB200/B300) decode kernel: tile shape, CTA roles,
// Tensor Memory (TMEM) column plan and shared-memory plan. docs/design.md ("SM100 kernel") has the
// picture; cuda/sm100/decode_kernel.cuh the protocol.
//
// CTA = 12 warps (384 threads), one CTA per SM:
//   warp 0        KV producer: one thread issues every TMA copy (Q and the KV ring), shared
//                 DecodeKVProducer of cuda/common/kv_producer.cuh;
//   warp 1        MMA warp: allocates TMEM (whole warp), one thread issues every tcgen05.mma and
//                 tcgen05.commit; frees TMEM at the end;
//   warps 2, 3    FP8 cache only: dequantize each tile's raw bytes in place (fp8_tiles.cuh); idle for
//                 a 16-bit cache (they keep the two compute warpgroups aligned on warpgroup
//                 boundaries, which the TMEM lane-quarter rule needs: warp w reads lanes 32 * (w % 4) ..);
//   warps 4-7     softmax warpgroup: S from TMEM, online softmax, P (16-bit) into shared memory;
//   warps 8-11    correction warpgroup: rescales O in TMEM when a row max grew, then the epilogue.
//
// MMAs: tcgen05.mma.ws.cta_group::1.kind::f16 (weight-stationary, M = 64), fp32 accumulation in TMEM.
//   S = Q K^T:  M = 64 query rows, N = 64 keys, K = 576 -> 36 MMAs of K = 16 (kMmaK).
//   O += P V:   M = 64, N = 256 per MMA (two V column halves, kPvN), K = 64 keys -> 2 x 4 MMAs.
//
// TMEM data path of an M = 64 .ws accumulator ("Layout E" of the PTX ISA data-path layouts, the
// "2x2 datapath" of CUTLASS's tmem_frg_ws): element (row m, column n) of an M = 64, N = N_MMA
// accumulator at address (lane, col) lives at
//     lane = m + 64 * (n / (N_MMA / 2)),   col = base_col + n % (N_MMA / 2),
// i.e. all 128 lanes are used and the accumulator takes only N_MMA / 2 columns. For the warp
// quarter q = warp % 4 this gives: rows 32 (q % 2) .. + 31, column half q / 2 of the accumulator.
//
// TMEM columns (512 allocated, 128 lanes each, 32-bit cells):
//   [  0, 128)  O[:,   0:256]  (P V half 0, N = 256 -> 128 columns)
//   [128, 256)  O[:, 256:512]  (P V half 1)
//   [256, 288)  S slot 0       (64 x 64 fp32 scores, N = 64 -> 32 columns)
//   [288, 320)  S slot 1       (S of the next tile is computed while softmax works on this one)
//   [320, 512)  unused (the allocation must be a power of two)
//
// Shared memory: Q (72 KB) resident, a ring of kNumKvStages KV stages of 72 KB (64 tokens x 576, as
// 9 TMA boxes of 64 x 64 with the 128-byte swizzle), mbarriers and small per-row arrays. V is the
// first 512 columns of the same stage (boxes 0-7); P of a tile is written into the stage's RoPE box
// (box 8), dead once S of that tile is complete. An FP8 cache lands in the same stages as raw bytes
// and is rewritten there as 16-bit boxes (Fp8Staging below, fp8_tiles.cuh).
#pragma once

#include <cstdint>

#include "../common/config.h"
#include "../common/fp8_tile.cuh"
#include "../common/kv_producer.cuh"
#include "descriptors.h"

namespace jax_mla::sm100 {

// ---- tile shape -------------------------------------------------------------------------------

inline constexpr int kBM = kBlockM;          // 64 query rows (s_q * h_q folded) per CTA
inline constexpr int kBN = kBlockN;          // 64 keys per KV tile (BN_QK), one scheduler block
inline constexpr int kQDepth = kHeadDimQK;   // 576: K of Q K^T
inline constexpr int kMmaK = 16;             // K per tcgen05.mma for 16-bit inputs
inline constexpr int kPvN = 256;             // N per P V MMA: O is computed as 2 halves of 256 columns
inline constexpr int kPvHalves = kHeadDimV / kPvN;
static_assert(kBM == 64 && kBN == 64, "the TMEM plan below assumes 64 x 64 score tiles");
static_assert(valid_ws_f16_shape(kBM, kBN) && valid_ws_f16_shape(kBM, kPvN), "tcgen05.mma.ws shapes");
static_assert(kQDepth % kMmaK == 0 && kBN % kMmaK == 0 && kKvBoxCols % kMmaK == 0);
static_assert(kPvN % kKvBoxCols == 0 && kPvHalves == 2);

// ---- CTA roles ----------------------------------------------------------------------------------

inline constexpr int kThreads = 384;
inline constexpr int kProducerWarp = 0;
inline constexpr int kMmaWarp = 1;
inline constexpr int kDequantWarp0 = 2;      // warps 2-3, FP8 cache only (fp8_tiles.cuh)
inline constexpr int kDequantWarps = 2;
inline constexpr int kSoftmaxWarp0 = 4;      // warps 4-7
inline constexpr int kCorrectionWarp0 = 8;   // warps 8-11
inline constexpr int kWarpgroupThreads = 128;
static_assert(kSoftmaxWarp0 % 4 == 0 && kCorrectionWarp0 % 4 == 0, "TMEM lane quarters need aligned warpgroups");
static_assert(kDequantWarp0 > kMmaWarp && kDequantWarp0 + kDequantWarps <= kSoftmaxWarp0,
              "the dequantizing warps are the otherwise idle warps 2 and 3");
static_assert(kCorrectionWarp0 * 32 + kWarpgroupThreads == kThreads);

// Named barriers (id 0 is __syncthreads).
enum NamedBarrier : int {
  kBarSoftmaxRowMax = 1,  // the softmax warpgroup's two key halves of every row exchanged their max
};

// Lazy rescaling: the running max a row's exponentials are taken against only moves when a tile's
// max exceeds it by more than this (log2 units), so P <= 2^8 and O is rescaled in TMEM rarely.
// Exact: the final normalisation divides by the row sum taken against the same reference. The SM90
// kernel uses the same slack (common/config.h).
inline constexpr float kRescaleThreshold = kLazyRescaleSlack;

// ---- TMEM column plan ---------------------------------------------------------------------------

inline constexpr int kTmemLanes = 128;
inline constexpr int kTmemColsMax = 512;
inline constexpr int kTmemColsO = kPvHalves * (kPvN / 2);      // 256: two N = 256 .ws accumulators
inline constexpr int kTmemColO = 0;                            // O half h at kTmemColO + h * kPvN / 2
inline constexpr int kNumSSlots = 2;
inline constexpr int kTmemColsS = kBN / 2;                     // 32 per 64 x 64 .ws accumulator
inline constexpr int kTmemColS = kTmemColO + kTmemColsO;       // S slot j at kTmemColS + j * kTmemColsS
inline constexpr int kTmemColsUsed = kTmemColS + kNumSSlots * kTmemColsS;
inline constexpr int kTmemAllocCols = 512;                     // power of two >= kTmemColsUsed
static_assert(kTmemColsUsed <= kTmemAllocCols && kTmemAllocCols <= kTmemColsMax, "TMEM: 512 columns");
static_assert(2 * kBM == kTmemLanes, "an M = 64 .ws accumulator spans all 128 lanes (two column halves)");

// ---- instruction descriptors (checked against hand-derived values in tests/cpu/cpp) -------------

// S = Q K^T: A = Q (M = 64 x K, K-major), B = K tile (N = 64 keys x K, K-major).
constexpr uint32_t idesc_qk(MmaInput t) { return make_instr_desc_f16(t, kBM, kBN, Major::kK, Major::kK); }
// O += P V: A = P (M = 64 x K = 64 keys, K-major), B = V (N = 256 columns x K = keys, stored as key
// rows: MN-major).
constexpr uint32_t idesc_pv(MmaInput t) { return make_instr_desc_f16(t, kBM, kPvN, Major::kK, Major::kMN); }
static_assert(idesc_qk(MmaInput::kBF16) == 0x04100490u && idesc_qk(MmaInput::kF16) == 0x04100010u);
static_assert(idesc_pv(MmaInput::kBF16) == 0x04410490u && idesc_pv(MmaInput::kF16) == 0x04410010u);

// ---- shared-memory plan -------------------------------------------------------------------------

inline constexpr int kSmemOptInLimit = 232448;   // 227 KB per block (sm_100)
inline constexpr int kSmemMiscBudget = 8192;     // barriers, per-row arrays, FP8 scales; checked below
// As many KV stages as fit beside the resident Q (2 for 16-bit: 72 KB each).
inline constexpr int kNumKvStages = (kSmemOptInLimit - 1024 - kKvTileBytes - kSmemMiscBudget) / kKvTileBytes;
static_assert(kNumKvStages >= 2, "one stage computes while the next one loads");
inline constexpr int kKvConsumers = 1;           // a stage is released by one tcgen05.commit (MMA warp)

// ---- FP8 cache (KvFormat::kFp8, fp8_tiles.cuh, common/fp8_tile.cuh) ------------------------------
//
// The SM90 kernel's plan on the stage ring: the producer lands a tile's raw bytes in the stage's own
// boxes, then warps 2-3 (kDequantWarps) rewrite them in place as the 16-bit boxes and arrive on the
// boxes' full barriers (initialised with kDequantWarps arrivals, no TMA bytes).
using Fp8Staging = jax_mla::Fp8Staging<kNumKvStages>;

template <typename Element>
struct alignas(1024) SharedStorage {
  Element q[kKvBoxesQK][kKvBoxElems];                 // (64 rows, 576) as 9 boxes of (64, 64)
  Element kv[kNumKvStages][kKvBoxesQK][kKvBoxElems];  // ring: (stage, 64 tokens, 576), P in box 8
  KVPipelineBarriers<kNumKvStages> kv_bars;           // full[stage][box] (TMA), empty[stage] (commit)
  uint64_t q_full;                                    // Q of the current piece landed (TMA)
  uint64_t q_empty;                                   // every S MMA reading Q completed (commit)
  uint64_t s_full[kNumSSlots];                        // S slot written (commit after the 36 MMAs)
  uint64_t s_empty[kNumSSlots];                       // S slot read by the softmax (128 arrivals)
  uint64_t p_full[kNumSSlots];                        // P in smem, dead V rows zeroed (128 arrivals)
  uint64_t o_ready;                                   // O rescaled / free for the next P V (128 arrivals)
  uint64_t o_full;                                    // P V complete (commit)
  uint64_t alpha_full[2];                             // a tile's rescale factors published (64 arrivals)
  uint64_t stats_full[2];                             // a piece's final row max / sums published (128)
  uint32_t tmem_base;                                 // written by tcgen05.alloc
  int tile_bad[kNumKvStages];                         // the stage's tile came from a bad block-table entry
  float row_max[2][2][kBM];                           // [tile parity][key half][row], log2 units
  float alpha[2][kBM];                                // [rescale event parity][row]
  float final_max[2][kBM];                            // [piece parity][row], log2 units
  float final_sum[2][2][kBM];                         // [piece parity][key half][row]
  int final_bad[2];                                   // [piece parity]
  Fp8Staging fp8;                                     // FP8 cache only (2 KB; unused for a 16-bit cache)
};

template <typename Element>
inline constexpr int kSmemBytes = sizeof(SharedStorage<Element>) + 1024;  // + alignment slack
static_assert(sizeof(SharedStorage<uint16_t>) - (1 + kNumKvStages) * kKvTileBytes <= kSmemMiscBudget,
              "misc shared memory exceeds its budget");
static_assert(sizeof(SharedStorage<uint16_t>) + 1024 <= kSmemOptInLimit, "exceeds the 227 KB opt-in limit");

}  // namespace jax_mla::sm100
