// What the host passes to the watchdog instantiation of a decode kernel (common/watchdog.cuh); plain
// C++ so that host code (the launchers, the self-check) can fill it.
#pragma once

#include <cstdint>

namespace jax_mla {

// A kernel parameter of the SM90 and SM100 decode kernels; production instantiations take it too,
// unused, so that both instantiations have one signature.
struct WatchdogParams {
  uint64_t budget_ns = 0;  // per CTA, from the CTA's first instruction
  int* expired = nullptr;  // global int the kernel sets to 1 when a wait gave up; zeroed by the host
  int withhold_tile = -1;  // fault injection: CTA-local tile index whose box 0 never arrives (-1: none)
};

}  // namespace jax_mla
