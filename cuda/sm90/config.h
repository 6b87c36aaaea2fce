// Compile-time configuration of the SM90 (H100/H200) decode kernel and its shared-memory plan.
//
// CTA = 3 warpgroups (384 threads), one CTA per SM:
//   warpgroup 0: the KV producer (one elected thread issues every TMA copy; registers shrunk to
//                kProducerRegs with setmaxnreg so the consumers can grow);
//   warpgroups 1, 2: consumers 0 and 1, "seesaw" schedule (decode_kernel.cuh). Consumer c owns the
//                CTA's tiles g with g % 2 == c: it computes their whole Q K^T (wgmma m64n64k16, Q and K
//                from smem) and softmax, keeps P in registers for its own P V and writes it into the
//                tile's dead RoPE box for the other consumer. P V is split by V columns: consumer c
//                accumulates O[:, 256c : 256c + 256] (128 fp32 registers per thread) over every tile,
//                from registers for its own tiles and from smem for the other's. While one consumer
//                runs its softmax, the other's wgmmas keep the tensor cores busy.
//
// KV lives in a ring of one-box slots (kv_producer.cuh, box ring). Wide shape: 18 slots, two whole
// tiles, each tile position freed once both consumers are done with it (as the two stages of
// before). Narrow shape: 25 slots, each box freed once its last reader is done (V columns 0-255:
// consumer 0's P V; 256-511: consumer 1's; the RoPE box, which holds P: the non-owner's P V), and
// the producer refills slot by slot.
//
// A third kernel, for <= 16 rows and only with a transposed JAX_MLA_SM90_NARROW, is TransposedShapeT
// below (transposed_kernel.cuh). Two shapes (KernelShape below), chosen per call by the number of
// query rows (launch.cuh), the narrow one only when DecodeParams::sm90_small_rows is kNarrow
// (JAX_MLA_SM90_NARROW=1; off by default: on an H100 it was not faster than the wide shape on
// b64/h16/8K, docs/performance.md 2026-12-05):
//   wide:   Q of a whole 64-row block (72 KB) + 18 slots, i.e. two whole tiles, as the two stages
//           of the kernel before the box ring;
//   narrow: rows <= 16 (e.g. h_q = 16, s_q = 1: DeepSeek-V3 at TP 8). Q keeps its 16 rows only
//           (18 KB), which leaves room for 25 slots: almost three tiles, so about two tiles of KV
//           can be in flight while the consumers compute, where the wide ring has one. The wgmma
//           still computes 64 rows: the descriptors of Q's (16, 64) boxes run on into the next
//           boxes for rows 16-63, whose scores are masked off (they never reach the output).
#pragma once

#include <cstdint>

#include "../common/config.h"
#include "../common/kv_producer.cuh"

namespace jax_mla::sm90 {

inline constexpr int kNumConsumers = 2;       // consumer warpgroups
inline constexpr int kThreads = 128 * (1 + kNumConsumers);
inline constexpr int kConsumerThreads = 128 * kNumConsumers;
inline constexpr int kColsPerConsumer = kHeadDimV / kNumConsumers;  // 256 columns of O each
inline constexpr int kVBoxesPerConsumer = kKvBoxesV / kNumConsumers;  // 4 boxes of 64 columns
inline constexpr int kProducerRegs = 40;
inline constexpr int kConsumerRegs = 232;
static_assert(kProducerRegs * 128 + kConsumerRegs * kConsumerThreads <= 65536, "register file");
static_assert(kBlockM == 64 && kBlockN == 64, "the wgmma tiling below assumes 64 x 64 score tiles");
static_assert(kNumConsumers == 2, "the seesaw alternates tile ownership between two consumers");

inline constexpr int kSmemOptInLimit = 232448;  // 227 KB per block on SM90

// Named barriers (id 0 is __syncthreads).
enum ConsumerBarrier : int {
  kBarPReady = 1,   // + owner: the owner's P and running max of its latest tile are in smem
                    // (owner: bar.arrive, the other consumer: bar.sync; 256 threads)
  kBarRowSum = 3,   // softmax denominators published (epilogue; 256 threads)
  kBarConsumer = 4, // + consumer: one consumer's 128 threads (its smem writes before its own wgmma)
  // Transposed shape (transposed_kernel.cuh):
  kBarTReduce = 6,  // + consumer: one consumer's 128 threads (cross-warp row reductions, P written)
  kBarTScores = 8,  // both consumers' S^T of the request's last tile completed (256; before zeroing V rows)
};

// Shape of one kernel instantiation.
//   kQRows:    query rows of a row block kept in shared memory (rows of the Q tensor map's box);
//   kNumSlots: one-box KV slots of the ring.
template <int kQRows_, int kNumSlots_>
struct KernelShape {
  static constexpr int kQRows = kQRows_;
  static constexpr int kNumSlots = kNumSlots_;
  static constexpr int kQBoxElems = kQRows * kKvBoxCols;  // (kQRows, 64)
  static constexpr bool kNarrow = kQRows < kBlockM;
  static_assert(kQRows == kBlockM || kQRows == 16, "Q is a whole row block or the narrow 16 rows");
  // The seesaw has two tiles in progress at once; tests/test_sm90_ring_protocol.py checks 18-27 slots.
  static_assert(kNumSlots >= 2 * kKvBoxesQK, "ring sizes below two tiles are not covered by the protocol model");
};
using WideShape = KernelShape<kBlockM, 2 * kKvBoxesQK>;  // 72 KB of Q + 2 x 72 KB of KV
using NarrowShape = KernelShape<16, 25>;                  // 18 KB of Q + 25 x 8 KB of KV

template <typename Element, typename Shape>
struct alignas(1024) SharedStorage {
  // Q first: the narrow shape's descriptors read rows 16-63 of box b from the 6 KB after it, i.e.
  // boxes b+1..b+3 and, for the last boxes, the first KV slots (masked rows; any value will do).
  Element q[kKvBoxesQK][Shape::kQBoxElems];             // (9 boxes, kQRows, 64)
  Element kv[Shape::kNumSlots][kKvBoxElems];            // (slot, BLK_N, 64): one box of one tile each
  BoxRingBarriers<Shape::kNumSlots> kv_bars;
  uint64_t q_full;                                      // Q of the current request landed
  uint64_t q_empty;                                     // consumers done with Q (2 arrivals)
  float row_max[kNumConsumers][kBlockM];                // per owner: running max after its latest tile (log2 units)
  float row_sum[2][kNumConsumers][kBlockM];             // per piece parity, per-consumer partial sums
  int bad_request[2];                                   // set by the producer, per piece parity
};

// Transposed shape (rows <= 16, only with JAX_MLA_SM90_NARROW=transposed; transposed_kernel.cuh).
// The consumers compute S^T = K Q^T and O^T = V^T P^T with wgmma m64n16k16 (M = keys, resp. value
// columns; N = the 16 query rows), so a tile costs the tensor work and the shared-memory reads of
// 16 rows instead of 64. Both consumers work on every tile: each computes the whole S^T (36 small
// wgmma; the same bits in both, so the same softmax, P, running max and sums) and P V for its half
// of the value columns (O^T 256 x 16: 32 fp32 registers a thread). Nothing is merged at the end and
// no smem holds O, which leaves room for the narrow shape's 25-slot ring: ~2.8 tiles, so while the
// consumers compute one tile more than one more tile of KV can be in flight. Each box is released
// twice, once per consumer (BoxRingBarriers box_releases = 2): the RoPE box and the other half's V
// boxes after the consumer's S^T, its own V boxes after its P V.
// (The first version, 2026-12-05: each consumer took whole tiles g % 2 on a two-tile ring, so each
// was a one-stage pipeline; on an H200 it ran b64/h16 at 191-193 us against the wide shape's
// 178-184: docs/performance.md, eleventh session.)
// kSplitK (JAX_MLA_SM90_NARROW=transposed_splitk; transposed_kernel.cuh): the consumers split S^T's
// 36 k-steps 18 / 18 and add the two partial S^T through shared memory (xchg, double-buffered by
// tile parity), so S^T is computed once per tile instead of twice; the 16 KB of xchg cost the ring
// two slots (23).
template <bool kSplitK>
using TransposedShapeT = KernelShape<16, kSplitK ? 23 : 25>;  // 18 KB of Q + 25 (23) x 8 KB of KV
using TransposedShape = TransposedShapeT<false>;
inline constexpr int kTRows = TransposedShape::kQRows;
inline constexpr int kTRegsO = kColsPerConsumer * kTRows / 128;  // 32: O^T (256, 16) fp32 per thread
inline constexpr int kTRegsS = kBlockN * kTRows / 128;           // 8: S^T (64, 16) fp32 per thread

template <typename Element, bool kSplitK = false>
struct alignas(1024) TransposedStorage {
  using Shape = TransposedShapeT<kSplitK>;
  Element q[kKvBoxesQK][Shape::kQBoxElems];             // (9 boxes, 16, 64)
  Element kv[Shape::kNumSlots][kKvBoxElems];            // (slot, BLK_N, 64)
  Element p[kNumConsumers][kTRows * kBlockN];           // per consumer: P (16 rows, 64 keys), K-major, 128B swizzle
  float reduce[kNumConsumers][4][kTRows];               // per consumer: tile row max, per warp and query row
  float sum_reduce[kNumConsumers][4][kTRows];           // per consumer, epilogue: row sums, per warp and query row
  // kSplitK: partial S^T, (tile parity, consumer, register quad, thread): a warp's float4 stores and
  // loads of one quad are 512 contiguous bytes (no bank conflict).
  float4 xchg[2][kNumConsumers][kTRegsS / 4][kSplitK ? 128 : 1];
  BoxRingBarriers<Shape::kNumSlots> kv_bars;
  uint64_t q_full;
  uint64_t q_empty;                                     // consumers done with Q (2 arrivals)
  int bad_request[2];                                   // set by the producer, per piece parity
};
static_assert(kTRows * kBlockN * 2 % 1024 == 0, "P buffers stay 1024-byte aligned (128B swizzle atoms)");

template <typename Element, typename Shape>
inline constexpr int kSmemBytes = sizeof(SharedStorage<Element, Shape>) + 1024;  // + alignment slack
template <typename Element, bool kSplitK>
inline constexpr int kSmemBytesT = sizeof(TransposedStorage<Element, kSplitK>) + 1024;
static_assert(kSmemBytesT<uint16_t, false> <= kSmemOptInLimit, "transposed shape exceeds the 227 KB opt-in limit");
static_assert(kSmemBytesT<uint16_t, true> <= kSmemOptInLimit, "split-K transposed shape exceeds the 227 KB opt-in limit");
static_assert(kSmemBytesT<uint16_t, true> + kKvBoxBytes > kSmemOptInLimit, "the split-K transposed ring could take one more slot");
static_assert(kSmemBytes<uint16_t, WideShape> <= kSmemOptInLimit, "wide shape exceeds the 227 KB opt-in limit");
static_assert(kSmemBytes<uint16_t, NarrowShape> <= kSmemOptInLimit, "narrow shape exceeds the 227 KB opt-in limit");
static_assert(kSmemBytes<uint16_t, NarrowShape> + kKvBoxBytes > kSmemOptInLimit, "the narrow ring could take one more slot");

}  // namespace jax_mla::sm90
