// Counters of the CUDA decode handler's work in this process, for tests and benchmarks
// (jax_mla._ext.testing.cuda_call_stats). Plain C++: a CPU-only build reports zeros.
#pragma once

namespace jax_mla {

struct CallStats {
  long long decode_calls;               // runs of the CUDA decode handler's execute stage
  long long decode_captured;            // of those, runs whose stream was capturing into a CUDA graph
                                        // (XLA command buffers; replays of the graph do not run it)
  long long sm90_fused_merge_launches;  // decode calls whose SM90 kernel merged the splits itself
};

void count_decode_call(bool captured);
void count_fused_merge_launch();
CallStats call_stats();

}  // namespace jax_mla
