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
//                from registers for its own tiles and from smem for the other's. With Q (72 KB)
//                resident, two 72 KB stages fit; tile g lives in stage g % 2, so a stage's owner is
//                fixed. While one consumer runs its softmax, the other's wgmmas keep the tensor
//                cores busy.
#pragma once

#include <cstdint>

#include "../common/config.h"
#include "../common/kv_producer.cuh"

namespace jax_mla::sm90 {

inline constexpr int kNumKvStages = 2;        // 2 x 72 KB + Q 72 KB: what fits in 227 KB
inline constexpr int kNumConsumers = 2;       // consumer warpgroups
inline constexpr int kThreads = 128 * (1 + kNumConsumers);
inline constexpr int kConsumerThreads = 128 * kNumConsumers;
inline constexpr int kColsPerConsumer = kHeadDimV / kNumConsumers;  // 256 columns of O each
inline constexpr int kProducerRegs = 40;
inline constexpr int kConsumerRegs = 232;
static_assert(kProducerRegs * 128 + kConsumerRegs * kConsumerThreads <= 65536, "register file");
static_assert(kBlockM == 64 && kBlockN == 64, "the wgmma tiling below assumes 64 x 64 score tiles");
static_assert(kNumKvStages >= 2, "one stage computes while the next one loads");

static_assert(kNumKvStages == kNumConsumers, "the seesaw ties stage s to its owner, consumer s");

// Named barriers (id 0 is __syncthreads).
enum ConsumerBarrier : int {
  kBarPReady = 1,   // + stage: the owner's P and running max of the tile in that stage are in smem
                    // (owner: bar.arrive, the other consumer: bar.sync; 256 threads)
  kBarRowSum = 3,   // softmax denominators published (epilogue; 256 threads)
  kBarConsumer = 4, // + consumer: one consumer's 128 threads (its smem writes before its own wgmma)
};

template <typename Element>
struct alignas(1024) SharedStorage {
  Element q[kKvBoxesQK][kKvBoxElems];                   // (BLK_M, 576) as 9 boxes of (64, 64)
  Element kv[kNumKvStages][kKvBoxesQK][kKvBoxElems];    // (stage, BLK_N, 576) as 9 boxes each
  KVPipelineBarriers<kNumKvStages> kv_bars;
  uint64_t q_full;                                      // Q of the current request landed
  uint64_t q_empty;                                     // consumers done with Q (2 arrivals)
  float row_max[kNumKvStages][kBlockM];                 // running max after the stage's tile (log2 units)
  float row_sum[2][kNumConsumers][kBlockM];             // per piece parity, per-consumer partial sums
  int bad_request[2];                                   // set by the producer, per piece parity
};

template <typename Element>
inline constexpr int kSmemBytes = sizeof(SharedStorage<Element>) + 1024;  // + alignment slack
static_assert(sizeof(SharedStorage<uint16_t>) + 1024 <= 232448, "exceeds the 227 KB opt-in limit");

}  // namespace jax_mla::sm90
