// Our Python binding of FlashMLA's SM90 sparse FP8 decode (DeepSeek-V3.2) for benchmarks/bench_sparse.py.
//
// FlashMLA's own module (csrc/api/api.cpp) binds `sparse_decode_fwd` = its interface function
// sparse_attn_decode_interface (csrc/api/sparse_decode.h), which flash_mla_interface.py's
// flash_mla_with_kvcache(..., is_fp8_kvcache=True, indices=...) calls as
//   sparse_decode_fwd(q, k_cache, indices, topk_length, attn_sink, sched_meta.tile_scheduler_metadata,
//                     sched_meta.num_splits, extra_k_cache, extra_indices, extra_topk_length,
//                     head_dim_v, softmax_scale)
// This file binds that function, unchanged, with the arguments the benchmark uses: no extra cache
// (extra_k_cache / extra_indices / extra_topk_length: None, MODEL1 only) and head_dim_v = 512.
//   sparse_decode_fwd(q, kv, indices, topk_length=None, attn_sink=None, tile_scheduler_metadata=None,
//                     num_splits=None, softmax_scale) -> (out, lse, tile_scheduler_metadata, num_splits)
//   q        bf16 [b, s_q, h_q, 576]          kv  uint8 [num_blocks, page_block_size, 1, 656] (V3.2 FP8 rows)
//   indices  int32 [b, s_q, topk]             flat slots block * page_block_size + row; -1 = none
//   out      bf16 [b, s_q, h_q, 512]          lse float32 [b, h_q, s_q] (a transposed view)
// Passing None for the metadata runs FlashMLA's scheduler (get_decoding_sched_meta) in the call and
// returns the plan; passing it back reuses it, as flash_mla_with_kvcache does after its first call.
#include <optional>

#include <pybind11/pybind11.h>

#include "api/sparse_decode.h"

namespace py = pybind11;

PYBIND11_MODULE(flashmla_sparse, m) {
  m.doc() = "FlashMLA's SM90 sparse FP8 MLA decode (deepseek-ai/FlashMLA), bound for jax-mla's benchmark";
  m.def(
      "sparse_decode_fwd",
      [](const at::Tensor &q, const at::Tensor &kv, const at::Tensor &indices,
         const std::optional<at::Tensor> &topk_length, const std::optional<at::Tensor> &attn_sink,
         std::optional<at::Tensor> tile_scheduler_metadata, std::optional<at::Tensor> num_splits,
         float softmax_scale) {
        const std::optional<at::Tensor> none;
        return sparse_attn_decode_interface(q, kv, indices, topk_length, attn_sink, tile_scheduler_metadata,
                                            num_splits, none, none, none, /*d_v=*/512, softmax_scale);
      },
      py::arg("q"), py::arg("kv"), py::arg("indices"), py::arg("topk_length") = py::none(),
      py::arg("attn_sink") = py::none(), py::arg("tile_scheduler_metadata") = py::none(),
      py::arg("num_splits") = py::none(), py::arg("softmax_scale"));
}
