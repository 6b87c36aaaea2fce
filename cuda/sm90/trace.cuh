// Debug-only event log of the SM90 decode kernel (CMake -DJAX_MLA_SM90_TRACE=ON; compiled out
// otherwise): one elected thread per role (the producer, consumer 0, consumer 1) of every CTA
// writes (clock64 << 8 | event) at the boundaries of its work, so the chain of one tile (S issued,
// S done, softmax done, P handed over, P V issued and done, stage released) can be measured instead
// of inferred from stall samples. benchmarks/trace_chain.py runs one call and prints the median
// time between consecutive events per role.
//
// Layout of DecodeParams::trace: (trace_ctas, kTraceRoles, kTraceSlots) uint64; slot 0 of each
// (CTA, role) holds the number of events that follow. CTA = blockIdx.x + gridDim.x * blockIdx.y;
// CTAs past trace_ctas and events past kTraceSlots - 1 are dropped. clock64 is per SM: compare
// times within one CTA only.
#pragma once

#include <cstdint>

#include "../common/params.h"

namespace jax_mla::sm90 {

enum TraceEvent : uint32_t {
  kTrPieceBegin = 1,   // consumer: Q of a piece landed
  kTrSIssued = 2,      // consumer: all 36 wgmma of an S issued (after the box waits)
  kTrSDone = 3,        // owner: its S completed (wait returned)
  kTrSoftmaxDone = 4,  // owner: P and the row max published (P-ready arrive)
  kTrPvOwnIssued = 5,  // owner: its P V issued
  kTrPReady = 6,       // non-owner: the P-ready barrier passed
  kTrPvOtherIssued = 7,  // non-owner: its P V issued
  kTrPvDone = 8,       // consumer: its P V of the previous tile completed (wait returned)
  kTrReleased = 9,     // consumer: it arrived on a stage's empty barrier
  kTrPieceEnd = 10,    // consumer: epilogue stored
  kTrLastBoxReady = 11,  // consumer: the wait on the last (RoPE) box of a tile's S returned
  kTrAcquired = 16,    // producer: a stage became free
  kTrLoadIssued = 17,  // producer: all TMA copies of a tile issued
};

inline constexpr int kTraceRoles = 3;  // producer, consumer 0, consumer 1
inline constexpr int kTraceSlots = 2048;

struct Tracer {
#if defined(JAX_MLA_SM90_TRACE) && JAX_MLA_SM90_TRACE
  uint64_t* log = nullptr;
  int n = 0;
  __device__ __forceinline__ void init(const DecodeParams& p, int role, bool elected) {
    const int cta = static_cast<int>(blockIdx.x + gridDim.x * blockIdx.y);
    if (elected && p.trace != nullptr && cta < p.trace_ctas) {
      log = p.trace + (static_cast<int64_t>(cta) * kTraceRoles + role) * kTraceSlots;
    }
  }
  __device__ __forceinline__ void mark(TraceEvent e) {
    if (log != nullptr && n < kTraceSlots - 1) {
      log[1 + n++] = (static_cast<uint64_t>(clock64()) << 8) | e;
    }
  }
  __device__ __forceinline__ void finish() {
    if (log != nullptr) log[0] = static_cast<uint64_t>(n);
  }
#else
  __device__ __forceinline__ void init(const DecodeParams&, int, bool) {}
  __device__ __forceinline__ void mark(TraceEvent) {}
  __device__ __forceinline__ void finish() {}
#endif
};

}  // namespace jax_mla::sm90
