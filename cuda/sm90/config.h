// Compile-time configuration of the SM90 (H100/H200) decode kernel and its shared-memory plan.
//
// CTA = 3 warpgroups (384 threads), one CTA per SM:
//   warpgroup 0: the KV producer (one elected thread issues every TMA copy; registers shrunk to
//                kProducerRegs with setmaxnreg so the consumers can grow);
//   warpgroups 1, 2: consumers 0 and 1, "seesaw" schedule (mainloop.cuh). Consumer c owns the
//                CTA's tiles g with g % 2 == c: it computes their whole Q K^T (wgmma m64n64k16, Q and K
//                from smem) and softmax, keeps P in registers for its own P V and writes it into the
//                tile's dead RoPE box for the other consumer. P V is split by V columns: consumer c
//                accumulates O[:, 256c : 256c + 256] (128 fp32 registers per thread) over every tile,
//                from registers for its own tiles and from smem for the other's. While one consumer
//                runs its softmax, the other's wgmmas keep the tensor cores busy.
//
// KV lives in a ring of 18 one-box slots (kv_producer.cuh, box ring): two whole tiles, each tile
// position freed once both consumers are done with it.
#pragma once

#include <cstdint>

#include "../common/config.h"
#include "../common/fp8_tile.cuh"
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
};

// The KV ring: two whole tiles. The seesaw has two tiles in progress at once;
// tests/cpu/test_sm90_ring_protocol.py checks the protocol on this ring.
inline constexpr int kNumSlots = 2 * kKvBoxesQK;
inline constexpr int kQBoxElems = kBlockM * kKvBoxCols;  // one (BLK_M, 64) box of Q
static_assert(kNumSlots % kKvBoxesQK == 0, "the box ring is released per whole tile (kv_producer.cuh)");

// The FP8 cache (KvFormat::kFp8, fp8_tiles.cuh, common/fp8_tile.cuh) fills the same ring of 16-bit
// boxes: the producer lands a tile's raw bytes in the tile's own slots, then warps 1-3 of warpgroup 0
// (kDequantWarps) rewrite them in place as the 16-bit boxes and arrive on the boxes' full barriers.
inline constexpr int kDequantWarps = 3;
inline constexpr int kRingTiles = kNumSlots / kKvBoxesQK;
using Fp8Staging = jax_mla::Fp8Staging<kRingTiles>;

// Slots of the per-piece bad-request flag, by piece ordinal. The producer clears piece k's slot
// before the piece's first tile, which it may issue while the consumers are still in the epilogue of
// piece k - 2 (common/kv_producer.cuh produce_part issues a tile before waiting for q_empty of piece
// k - 1, and q_empty of piece k - 2 is all it has passed): slot k must not be piece k - 2's, so
// two slots are too few. tests/cpu/test_sm90_ring_protocol.py checks it.
inline constexpr int kBadFlagSlots = 4;
static_assert((kBadFlagSlots & (kBadFlagSlots - 1)) == 0 && kBadFlagSlots >= 3);

template <typename Element>
struct alignas(1024) SharedStorage {
  Element q[kKvBoxesQK][kQBoxElems];                    // (9 boxes, BLK_M, 64): Q of the row block, 72 KB
  Element kv[kNumSlots][kKvBoxElems];                   // (slot, BLK_N, 64): one box of one tile each
  BoxRingBarriers<kNumSlots> kv_bars;
  uint64_t q_full;                                      // Q of the current request landed
  uint64_t q_empty;                                     // consumers done with Q (2 arrivals)
  float row_max[kNumConsumers][kBlockM];                // per owner: running max after its latest tile (log2 units)
  float row_sum[2][kNumConsumers][kBlockM];             // per piece parity, per-consumer partial sums
  int bad_request[kBadFlagSlots];                       // set by the producer, per piece ordinal % slots
  Fp8Staging fp8;                                       // FP8 cache only (2 KB; unused for a 16-bit cache)
};

template <typename Element>
inline constexpr int kSmemBytes = sizeof(SharedStorage<Element>) + 1024;  // + alignment slack
static_assert(kSmemBytes<uint16_t> <= kSmemOptInLimit, "the kernel exceeds the 227 KB opt-in limit");

}  // namespace jax_mla::sm90
