// Our Python binding of FlashMLA's SM90 dense decode for benchmarks/bench_peers.py.
//
// FlashMLA's own module (csrc/api/api.cpp) binds its whole API, sparse and SM100 kernels included;
// the benchmark needs only the dense decode, so this file binds that one interface function, from
// FlashMLA's csrc/api/dense_decode.h, unchanged: (q, kcache, head_size_v, seqlens_k, block_table,
// softmax_scale, is_causal, tile_scheduler_metadata, num_splits) -> (out, lse, metadata, num_splits).
// Passing None for the metadata plans the split (its get_decoding_sched_meta kernel) and returns it.
#include <pybind11/pybind11.h>

#include "api/dense_decode.h"

PYBIND11_MODULE(flashmla_dense, m) {
  m.doc() = "FlashMLA's SM90 dense MLA decode (deepseek-ai/FlashMLA), bound for jax-mla's benchmark";
  m.def("dense_decode_fwd", &dense_attn_decode_interface);
}
