// Static checks of the jax_mla_decode_sparse buffers and attributes, and the SparseProblem a
// valid call describes. Header-only so that the CPU and the CUDA handler report the same messages.
// Buffer order: docs/design.md ("Sparse decode").
#pragma once

#include <cstdint>

#include "common/config.h"
#include "common/sparse_problem.h"
#include "ffi/decode_args.h"
#include "runtime/limits.h"
#include "xla/ffi/api/ffi.h"

namespace jax_mla {
namespace ffi_args {

inline constexpr const char* kSparseTarget = "jax_mla_decode_sparse";

inline ffi::Error check_sparse(ffi::AnyBuffer q,            // (b, s_q, h_q, 576) bf16 | f16
                               ffi::AnyBuffer kv_cache,     // (num_pages, page_size, 576) q's dtype | (..., 656) u8
                               ffi::AnyBuffer indices,      // (b, s_q, topk) s32
                               ffi::AnyBuffer topk_length,  // (0,) or (b,) s32
                               ffi::AnyBuffer attn_sink,    // (0,), (h_q,) or (b, h_q) f32
                               ffi::AnyBuffer out,          // (b, s_q, h_q, 512) q's dtype
                               ffi::AnyBuffer lse,          // (b, s_q, h_q) f32
                               float softmax_scale, SparseProblem* problem) {
  constexpr const char* kTarget = kSparseTarget;
  QDims qdims;
  if (ffi::Error e = check_q(kTarget, q, &qdims); e.failure()) return e;
  const int64_t batch = qdims.batch, seq_q = qdims.seq_q, heads_q = qdims.heads_q;
  const ffi::DataType dtype = qdims.dtype;
  bool fp8 = false;
  if (ffi::Error e = check_kv_cache(kTarget, kv_cache, dtype, &fp8); e.failure()) return e;
  const auto kd = kv_cache.dimensions();
  const int64_t num_slots = kd[0] * kd[1];
  if (num_slots > kIntMax) {
    return invalid_argument(kTarget, "kv_cache has ", num_slots, " token slots, above ", kIntMax,
                            " (indices are int32 slots)");
  }
  const auto id = indices.dimensions();
  if (indices.element_type() != ffi::DataType::S32) {
    return invalid_argument(kTarget, "indices must be int32, got ", dtype_name(indices.element_type()));
  }
  if (id.size() != 3 || id[0] != batch || id[1] != seq_q || id[2] < 1 || id[2] > kIntMax) {
    return invalid_argument(kTarget, "indices must have shape (", batch, ", ", seq_q, ", topk >= 1), got ",
                            shape_string(id));
  }
  const auto td = topk_length.dimensions();
  if (topk_length.element_type() != ffi::DataType::S32 || td.size() != 1 || (td[0] != 0 && td[0] != batch)) {
    return invalid_argument(kTarget, "topk_length must be int32 of shape (0,) or (", batch, ",), got ",
                            dtype_name(topk_length.element_type()), " ", shape_string(td));
  }
  const auto sd = attn_sink.dimensions();
  const bool sink_ok = (sd.size() == 1 && (sd[0] == 0 || sd[0] == heads_q)) ||
                       (sd.size() == 2 && sd[0] == batch && sd[1] == heads_q);  // (b, h_q): per request (vmap)
  if (attn_sink.element_type() != ffi::DataType::F32 || !sink_ok) {
    return invalid_argument(kTarget, "attn_sink must be float32 of shape (0,), (", heads_q, ",) or (", batch, ", ",
                            heads_q, "), got ",
                            dtype_name(attn_sink.element_type()), " ", shape_string(sd));
  }
  if (ffi::Error e = check_out_lse(kTarget, out, lse, qdims); e.failure()) return e;
  if (ffi::Error e = check_softmax_scale(kTarget, softmax_scale); e.failure()) return e;
  SparseProblem& p = *problem;
  p.batch = static_cast<int>(batch);
  p.seq_q = static_cast<int>(seq_q);
  p.heads_q = static_cast<int>(heads_q);
  p.topk = static_cast<int>(id[2]);
  p.num_slots = num_slots;
  p.dtype = dtype == ffi::DataType::BF16 ? DType::kBF16 : DType::kF16;
  p.kv_format = fp8 ? KvFormat::kFp8 : KvFormat::kDense;
  p.softmax_scale = softmax_scale;
  p.q = q.untyped_data();
  p.kv_cache = kv_cache.untyped_data();
  p.indices = static_cast<const int32_t*>(indices.untyped_data());
  p.topk_length = td[0] != 0 ? static_cast<const int32_t*>(topk_length.untyped_data()) : nullptr;
  p.attn_sink = attn_sink.element_count() != 0 ? static_cast<const float*>(attn_sink.untyped_data()) : nullptr;
  p.sink_per_request = sd.size() == 2;
  p.out = out.untyped_data();
  p.lse = static_cast<float*>(lse.untyped_data());
  return ffi::Error::Success();
}

}  // namespace ffi_args
}  // namespace jax_mla
