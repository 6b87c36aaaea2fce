// See call_stats.h.
#include "runtime/call_stats.h"

#include <atomic>

namespace jax_mla {
namespace {

std::atomic<long long> g_decode_calls{0};
std::atomic<long long> g_decode_captured{0};
std::atomic<long long> g_sm90_fused_merge_launches{0};

}  // namespace

void count_decode_call(bool captured) {
  g_decode_calls.fetch_add(1, std::memory_order_relaxed);
  if (captured) g_decode_captured.fetch_add(1, std::memory_order_relaxed);
}

void count_fused_merge_launch() { g_sm90_fused_merge_launches.fetch_add(1, std::memory_order_relaxed); }

CallStats call_stats() {
  return {g_decode_calls.load(std::memory_order_relaxed), g_decode_captured.load(std::memory_order_relaxed),
          g_sm90_fused_merge_launches.load(std::memory_order_relaxed)};
}

}  // namespace jax_mla
