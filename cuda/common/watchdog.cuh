// Bounded barrier waits for the self-check: the wait policy every mbarrier wait of the SM90 and
// SM100 decode kernels (and of the shared KV producer, kv_producer.cuh) goes through.
//
// Production kernels are instantiated with NoWatchdog: its wait is ptx::mbarrier_wait, it holds no
// state and its fault hook is a compile-time "no", so their machine code is that of a plain wait.
// The self-check (runtime/self_check.cu) launches a second instantiation with Watchdog, because a
// kernel that never ran on its hardware (SM100) may hang, and a hang there would block the
// process's initialization forever at the stream synchronize, while a trap would poison the CUDA
// context, so that the portable fallback could not run either. With Watchdog:
//   - every wait polls %globaltimer; once the CTA's deadline (its start + WatchdogParams::budget_ns)
//     has passed, a wait that is not complete sets *expired and returns as if it were, and so does
//     every later wait of every thread of the CTA (they all share the deadline). Control flow in the
//     kernels depends only on the schedule, never on a barrier's outcome, so every role then runs
//     through its remaining pieces without blocking (computing garbage, which the host discards),
//     every named barrier and __syncthreads is still reached by all its threads, and the CTA ends
//     through its normal teardown (the SM100 MMA warp frees its Tensor Memory); the producer issues
//     no copy after the deadline (live());
//   - settle() at the end keeps an expired CTA alive a little longer, so that the TMA copies and
//     tensor-core operations it issued after the deadline land before its shared memory and Tensor
//     Memory are released;
//   - no trap: the host reads *expired after its synchronize and fails the check, and the context
//     stays usable for the fallback.
// Fault injection (JAX_MLA_SELFCHECK=hang): the shared producer withholds the arrival (and copy) of
// box 0 of the CTA's tile `withhold_tile`, so its consumers wait for a barrier that never completes:
// the watchdog path can be exercised on any GPU whose kernel uses the shared producer (SM90 on an
// H100 included).
#pragma once

#include <cstdint>

#include "ptx.cuh"
#include "watchdog_params.h"

namespace jax_mla {

// Production: unbounded waits.
struct NoWatchdog {
  static constexpr bool kEnabled = false;
  __device__ __forceinline__ static NoWatchdog start(const WatchdogParams&) { return {}; }
  __device__ __forceinline__ void wait(uint64_t* bar, uint32_t phase) const { ptx::mbarrier_wait(bar, phase); }
  // The box of the CTA's tile `tile` whose arrival the producer withholds: none.
  __device__ __forceinline__ static constexpr int withheld_box(int) { return -1; }
  // Before the deadline (see Watchdog::live).
  __device__ __forceinline__ static constexpr bool live() { return true; }
  __device__ __forceinline__ void settle() const {}
};

struct Watchdog {
  static constexpr bool kEnabled = true;
  // An expired CTA waits this long before its teardown (see settle()); every copy or MMA it issued
  // completes in microseconds.
  static constexpr uint64_t kSettleNs = 1000 * 1000;

  uint64_t deadline;  // %globaltimer ns
  int* expired;
  int withhold_tile;

  __device__ __forceinline__ static Watchdog start(const WatchdogParams& p) {
    return {ptx::global_timer_ns() + p.budget_ns, p.expired, p.withhold_tile};
  }

  // Blocks until the phase with parity `phase` completed, or the deadline passed (then records the
  // expiry and returns). After the deadline a wait costs one test and one timer read.
  __device__ __forceinline__ void wait(uint64_t* bar, uint32_t phase) const {
    for (;;) {
      if (ptx::mbarrier_test_wait(bar, phase)) return;
      if (ptx::global_timer_ns() > deadline) {
        *reinterpret_cast<volatile int*>(expired) = 1;
        return;
      }
      ptx::mbarrier_try_wait(bar, phase);  // suspends until the phase completes or a short time limit
    }
  }

  __device__ __forceinline__ int withheld_box(int tile) const { return tile == withhold_tile ? 0 : -1; }

  // Whether the deadline is still ahead. The producer issues no copy (no transaction arrival) once
  // it has passed, so that the only arrivals after the deadline are counted ones (releases, commits),
  // which complete a phase at zero and can never underflow (kv_producer.cuh produce_part).
  __device__ __forceinline__ bool live() const { return ptx::global_timer_ns() <= deadline; }

  // Called by every thread after its last operation, before the CTA's teardown.
  __device__ __forceinline__ void settle() const {
    if (ptx::global_timer_ns() <= deadline) return;
    const uint64_t until = ptx::global_timer_ns() + kSettleNs;
    while (ptx::global_timer_ns() < until) __nanosleep(10000);
  }
};

}  // namespace jax_mla
