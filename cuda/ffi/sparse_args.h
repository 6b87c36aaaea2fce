// Static checks of the jax_mla_decode_sparse buffers and attributes, and the SparseProblem a
// valid call describes. Header-only so that a future CUDA handler reports the same messages.
// Buffer order: docs/design.md ("Sparse decode").
#pragma once

#include <cmath>
#include <cstdint>

#include "common/config.h"
#include "cpu/sparse_cpu.h"
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
  const auto qd = q.dimensions();
  if (qd.size() != 4 || qd[3] != kHeadDimQK) {
    return invalid_argument(kTarget, "q must have shape (b, s_q, h_q, ", kHeadDimQK, "), got ", shape_string(qd));
  }
  const ffi::DataType dtype = q.element_type();
  if (dtype != ffi::DataType::BF16 && dtype != ffi::DataType::F16) {
    return invalid_argument(kTarget, "q must be bfloat16 or float16, got ", dtype_name(dtype));
  }
  const int64_t batch = qd[0], seq_q = qd[1], heads_q = qd[2];
  if (batch > kIntMax) return invalid_argument(kTarget, "batch size ", batch, " exceeds ", kIntMax);
  if (seq_q < 1 || seq_q > kMaxSeqQ) {
    return invalid_argument(kTarget, "s_q = q.shape[1] = ", seq_q, " must be in [1, ", kMaxSeqQ, "]");
  }
  if (heads_q < 1 || heads_q > kMaxHeadsQ) {
    return invalid_argument(kTarget, "h_q = q.shape[2] = ", heads_q, " must be in [1, ", kMaxHeadsQ, "]");
  }
  const bool fp8 = kv_cache.element_type() == ffi::DataType::U8;
  if (!fp8 && kv_cache.element_type() != dtype) {
    return invalid_argument(kTarget, "kv_cache dtype ", dtype_name(kv_cache.element_type()),
                            " differs from q dtype ", dtype_name(dtype), " (or is uint8 for FP8 rows of ",
                            kFp8RowBytes, " bytes)");
  }
  const int64_t row_width = fp8 ? kFp8RowBytes : kHeadDimQK;
  const auto kd = kv_cache.dimensions();
  if (kd.size() != 3 || kd[2] != row_width || kd[1] < 1) {
    return invalid_argument(kTarget, "kv_cache must have shape (num_pages, page_size >= 1, ", row_width, "), got ",
                            shape_string(kd));
  }
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
  const auto od = out.dimensions();
  if (od.size() != 4 || od[0] != batch || od[1] != seq_q || od[2] != heads_q || od[3] != kHeadDimV ||
      out.element_type() != dtype) {
    return invalid_argument(kTarget, "out must be ", dtype_name(dtype), " (", batch, ", ", seq_q, ", ", heads_q, ", ",
                            kHeadDimV, "), got ", dtype_name(out.element_type()), " ", shape_string(od));
  }
  const auto ld = lse.dimensions();
  if (ld.size() != 3 || ld[0] != batch || ld[1] != seq_q || ld[2] != heads_q ||
      lse.element_type() != ffi::DataType::F32) {
    return invalid_argument(kTarget, "lse must be float32 (", batch, ", ", seq_q, ", ", heads_q, "), got ",
                            dtype_name(lse.element_type()), " ", shape_string(ld));
  }
  if (!(softmax_scale > 0.f) || !std::isfinite(softmax_scale)) {
    return invalid_argument(kTarget, "softmax_scale must be positive and finite, got ", softmax_scale);
  }
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
