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
// times within one CTA only; the CTA role's entry and dependency events and every role's exit are
// also stamped with %globaltimer (kTrNsFlag), which is comparable across CTAs.
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
  kTrReleased = 9,     // consumer: it released a tile (its boxes; wide shape: its share of the tile's position)
  kTrPieceEnd = 10,    // consumer: epilogue stored
  kTrLastBoxReady = 11,  // consumer: the wait on the last (RoPE) box of a tile's S returned
  kTrAcquired = 16,    // producer: the slot of a tile's box 0 became free (wide shape: the whole tile's)
  kTrLoadIssued = 17,  // producer: all TMA copies of a tile issued
  kTrCtaEntry = 18,    // CTA role: the kernel's first instruction (thread 0)
  kTrDepReady = 19,    // CTA role: grid_dependency_wait returned (the earlier kernel's memory is visible)
  kTrExit = 20,        // every role: its last event
  kTrProducerStart = 21,  // producer: its role began (after the dependency wait and setmaxnreg)
  kTrQSlotFree = 22,   // producer: a piece's schedule entry, length and split offsets read, Q's buffer free
  kTrArrived = 23,     // consumer (fused merge): its split piece's arrival counted (after the release)
  kTrMergeWaitDone = 24,  // consumer (fused merge): every piece of a split request it merges has arrived
  kTrMergeDone = 25,   // consumer (fused merge): its share of that request's rows merged and stored
};

// Events stamped with %globaltimer (ns, low 56 bits) instead of clock64 carry this flag in their id;
// each follows the clock64 event of the same id, so the pair gives the SM clock (clocks per ns) and
// times that can be compared across CTAs (clock64 cannot: it is per SM).
inline constexpr uint32_t kTrNsFlag = 0x80;

inline constexpr int kTraceRoles = 4;  // producer, consumer 0, consumer 1, the CTA (entry, dependency)
inline constexpr int kTraceRoleCta = 3;
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
  // The clock64 event e, then the same event with the global timer (ns since an arbitrary epoch).
  __device__ __forceinline__ void mark_both(TraceEvent e) {
    mark(e);
    if (log != nullptr && n < kTraceSlots - 1) {
      uint64_t ns;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
      log[1 + n++] = ((ns & ((uint64_t(1) << 56) - 1)) << 8) | (e | kTrNsFlag);
    }
  }
  __device__ __forceinline__ void finish() {
    mark_both(kTrExit);
    if (log != nullptr) log[0] = static_cast<uint64_t>(n);
  }
#else
  __device__ __forceinline__ void init(const DecodeParams&, int, bool) {}
  __device__ __forceinline__ void mark(TraceEvent) {}
  __device__ __forceinline__ void mark_both(TraceEvent) {}
  __device__ __forceinline__ void finish() {}
#endif
};

}  // namespace jax_mla::sm90
