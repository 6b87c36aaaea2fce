// Compile-time configuration of the SM90 (H100/H200) decode kernel and its shared-memory plan.
//
// CTA = 3 warpgroups (384 threads), one CTA per SM:
//   warpgroup 0: the KV producer (one elected thread issues every TMA copy; registers shrunk to
//                kProducerRegs with setmaxnreg so the consumers can grow);
//   warpgroups 1, 2: consumers 0 and 1. Each 64-key tile is split by keys for Q K^T (consumer c
//                scores keys [32c, 32c + 32)) and by V columns for P V (consumer c accumulates
//                O[:, 256c : 256c + 256], 128 fp32 registers per thread); P goes through the tile's
//                RoPE box, dead once both Q K^T are done. With Q (72 KB) resident, two 72 KB stages
//                fit: one tile is computed while the next one streams in.
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

// Named barriers among the 256 consumer threads (id 0 is __syncthreads).
enum ConsumerBarrier : int {
  kBarRowMax = 1,   // local row maxima published
  kBarPReady = 2,   // both P halves in shared memory (and dead V rows zeroed)
  kBarRowSum = 3,   // softmax denominators published (epilogue)
};

template <typename Element>
struct alignas(1024) SharedStorage {
  Element q[kKvBoxesQK][kKvBoxElems];                   // (BLK_M, 576) as 9 boxes of (64, 64)
  Element kv[kNumKvStages][kKvBoxesQK][kKvBoxElems];    // (stage, BLK_N, 576) as 9 boxes each
  KVPipelineBarriers<kNumKvStages> kv_bars;
  uint64_t q_full;                                      // Q of the current request landed
  uint64_t q_empty;                                     // consumers done with Q (2 arrivals)
  float row_max[kNumConsumers][kBlockM];                // per-consumer local row max (log2 units)
  float row_sum[kNumConsumers][kBlockM];                // per-consumer softmax denominators
  int bad_request[2];                                   // set by the producer, per piece parity
};

template <typename Element>
inline constexpr int kSmemBytes = sizeof(SharedStorage<Element>) + 1024;  // + alignment slack
static_assert(sizeof(SharedStorage<uint16_t>) + 1024 <= 232448, "exceeds the 227 KB opt-in limit");

}  // namespace jax_mla::sm90
