// Static checks of the jax_mla_decode / jax_mla_decode_schedule buffers and attributes (what can
// be checked without reading device data), against the limits of runtime/limits.h, and the
// DecodeProblem a valid call describes. Header-only so that the CPU handler and the CUDA handler
// report the same messages for the same mistakes.
//
// Buffer order and shapes are the contract of docs/design.md ("FFI targets").
#pragma once

#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>

#include "common/config.h"
#include "common/problem.h"
#include "common/scheduler.h"
#include "runtime/kernel_select.h"
#include "runtime/limits.h"
#include "xla/ffi/api/ffi.h"

namespace jax_mla {
namespace ffi_args {

namespace ffi = ::xla::ffi;

// ffi::Error(kInvalidArgument, "<target>: " + the streamed arguments).
template <typename... Parts>
ffi::Error invalid_argument(const char* target, const Parts&... parts) {
  std::ostringstream os;
  os << target << ": ";
  (os << ... << parts);
  return ffi::Error(ffi::ErrorCode::kInvalidArgument, os.str());
}

// "(2, 1, 16, 576)"
inline std::string shape_string(ffi::AnyBuffer::Dimensions dims) {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(dims[i]);
  }
  return s + (dims.size() == 1 ? ",)" : ")");
}

inline const char* dtype_name(ffi::DataType t) {
  switch (t) {
    case ffi::DataType::BF16: return "bfloat16";
    case ffi::DataType::F16: return "float16";
    case ffi::DataType::F32: return "float32";
    case ffi::DataType::F64: return "float64";
    case ffi::DataType::S32: return "int32";
    case ffi::DataType::S64: return "int64";
    case ffi::DataType::U8: return "uint8";
    default: return "an unsupported dtype";
  }
}

// q (b, s_q, h_q, 576) bf16 | f16 within the limits: what every target taking q checks first,
// since q fixes b, s_q, h_q and the dtype that the other buffers are checked against.
struct QDims {
  int64_t batch = 0, seq_q = 0, heads_q = 0;
  ffi::DataType dtype = ffi::DataType::BF16;
};

inline ffi::Error check_q(const char* target, ffi::AnyBuffer q, QDims* dims) {
  const auto qd = q.dimensions();
  if (qd.size() != 4 || qd[3] != kHeadDimQK) {
    return invalid_argument(target, "q must have shape (b, s_q, h_q, ", kHeadDimQK, "), got ", shape_string(qd));
  }
  const ffi::DataType dtype = q.element_type();
  if (dtype != ffi::DataType::BF16 && dtype != ffi::DataType::F16) {
    return invalid_argument(target, "q must be bfloat16 or float16, got ", dtype_name(dtype));
  }
  const int64_t batch = qd[0], seq_q = qd[1], heads_q = qd[2];
  if (batch > kIntMax) return invalid_argument(target, "batch size ", batch, " exceeds ", kIntMax);
  if (seq_q < 1 || seq_q > kMaxSeqQ) {
    return invalid_argument(target, "s_q = q.shape[1] = ", seq_q, " must be in [1, ", kMaxSeqQ, "]");
  }
  if (heads_q < 1 || heads_q > kMaxHeadsQ) {
    return invalid_argument(target, "h_q = q.shape[2] = ", heads_q, " must be in [1, ", kMaxHeadsQ, "]");
  }
  *dims = QDims{batch, seq_q, heads_q, dtype};
  return ffi::Error::Success();
}

// kv_cache (num_pages, page_size >= 1, row): the cache's element type picks its format, q's dtype
// (576 values a token) or uint8 (the 656-byte FP8 row of common/config.h). Anything else is a
// mistake, whatever its shape.
inline ffi::Error check_kv_cache(const char* target, ffi::AnyBuffer kv_cache, ffi::DataType dtype, bool* fp8) {
  *fp8 = kv_cache.element_type() == ffi::DataType::U8;
  if (!*fp8 && kv_cache.element_type() != dtype) {
    return invalid_argument(target, "kv_cache dtype ", dtype_name(kv_cache.element_type()),
                            " differs from q dtype ", dtype_name(dtype), " (or is uint8 for FP8 rows of ",
                            kFp8RowBytes, " bytes)");
  }
  const int64_t row_width = *fp8 ? kFp8RowBytes : kHeadDimQK;
  const auto kd = kv_cache.dimensions();
  if (kd.size() != 3 || kd[2] != row_width) {
    return invalid_argument(target, "kv_cache must have shape (num_pages, page_size, ", row_width, ")",
                            *fp8 ? " (uint8: FP8 rows)" : "", ", got ", shape_string(kd));
  }
  if (kd[1] < 1) return invalid_argument(target, "kv_cache page_size = kv_cache.shape[1] must be >= 1, got ", kd[1]);
  if (kd[0] > kIntMax || kd[1] > kIntMax) {
    return invalid_argument(target, "kv_cache shape ", shape_string(kd), " has a dimension above ", kIntMax);
  }
  return ffi::Error::Success();
}

// The results out (b, s_q, h_q, 512) in q's dtype and lse (b, s_q, h_q) float32.
inline ffi::Error check_out_lse(const char* target, ffi::AnyBuffer out, ffi::AnyBuffer lse, const QDims& q) {
  const auto od = out.dimensions();
  if (od.size() != 4 || od[0] != q.batch || od[1] != q.seq_q || od[2] != q.heads_q || od[3] != kHeadDimV) {
    return invalid_argument(target, "out must have shape (", q.batch, ", ", q.seq_q, ", ", q.heads_q, ", ",
                            kHeadDimV, "), got ", shape_string(od));
  }
  if (out.element_type() != q.dtype) {
    return invalid_argument(target, "out dtype ", dtype_name(out.element_type()), " differs from q dtype ",
                            dtype_name(q.dtype));
  }
  const auto ld = lse.dimensions();
  if (ld.size() != 3 || ld[0] != q.batch || ld[1] != q.seq_q || ld[2] != q.heads_q) {
    return invalid_argument(target, "lse must have shape (", q.batch, ", ", q.seq_q, ", ", q.heads_q, "), got ",
                            shape_string(ld));
  }
  if (lse.element_type() != ffi::DataType::F32) {
    return invalid_argument(target, "lse must be float32, got ", dtype_name(lse.element_type()));
  }
  return ffi::Error::Success();
}

// Mirrors _validate.check_softmax_scale: the kernels scale the row max of the raw scores, which
// is the max of the scaled scores only for a positive, finite scale.
inline ffi::Error check_softmax_scale(const char* target, float softmax_scale) {
  if (!(softmax_scale > 0.f) || !std::isfinite(softmax_scale)) {
    return invalid_argument(target, "softmax_scale must be positive and finite, got ", softmax_scale);
  }
  return ffi::Error::Success();
}

// The problem a valid jax_mla_decode call describes.
struct DecodeShape {
  int batch = 0, seq_q = 0, heads_q = 0, rows = 0;  // rows = seq_q * heads_q
  int num_pages = 0, page_size = 0, max_pages = 0;
  int num_parts = 0;
  DType dtype = DType::kBF16;
  KvFormat kv_format = KvFormat::kDense;
  bool schedule_given = false;  // false: the schedule operand has shape (0,), plan it in the op
  // The batch-invariant plan ({0, 0}: the default plans). max_chunks is S for this call: the op's
  // own plan bounds it by the block table's capacity, a passed schedule (decode_schedule, which
  // does not know the table) by num_parts alone (scheduler.h invariant_max_chunks).
  ChunkSpec chunks{0, 0};
};

// The `chunk_blocks` attribute of both targets: 0 (the default plans) or the batch-invariant
// plan's chunk size in [1, kMaxInvariantChunkBlocks] blocks.
inline bool chunk_blocks_ok(int32_t chunk_blocks) {
  return chunk_blocks >= 0 && chunk_blocks <= kMaxInvariantChunkBlocks;
}

// Checks the operands, results and attributes of jax_mla_decode; on success `shape` describes them.
inline ffi::Error check_decode(ffi::AnyBuffer q,            // (b, s_q, h_q, 576) bf16 | f16
                               ffi::AnyBuffer kv_cache,     // (num_pages, page_size, 576) q's dtype | (..., 656) u8
                               ffi::AnyBuffer block_table,  // (b, max_pages) s32
                               ffi::AnyBuffer seq_lens,     // (b,) s32
                               ffi::AnyBuffer schedule,     // (0,) or (schedule_size(b, num_parts),) s32
                               ffi::AnyBuffer out,          // (b, s_q, h_q, 512) q's dtype
                               ffi::AnyBuffer lse,          // (b, s_q, h_q) f32
                               float softmax_scale, int32_t num_parts, int32_t kernel, int32_t chunk_blocks,
                               DecodeShape* shape) {
  constexpr const char* kTarget = "jax_mla_decode";

  QDims qdims;
  if (ffi::Error e = check_q(kTarget, q, &qdims); e.failure()) return e;
  const int64_t batch = qdims.batch, seq_q = qdims.seq_q, heads_q = qdims.heads_q;
  const ffi::DataType dtype = qdims.dtype;
  bool fp8 = false;
  if (ffi::Error e = check_kv_cache(kTarget, kv_cache, dtype, &fp8); e.failure()) return e;
  const int64_t num_pages = kv_cache.dimensions()[0], page_size = kv_cache.dimensions()[1];

  const auto bd = block_table.dimensions();
  if (block_table.element_type() != ffi::DataType::S32) {
    return invalid_argument(kTarget, "block_table must be int32, got ", dtype_name(block_table.element_type()));
  }
  if (bd.size() != 2 || bd[0] != batch) {
    return invalid_argument(kTarget, "block_table must have shape (b, max_pages) with b = ", batch,
                            " (from q), got ", shape_string(bd));
  }
  const int64_t max_pages = bd[1];
  if (max_pages > kIntMax) return invalid_argument(kTarget, "block_table has ", max_pages, " columns, above ", kIntMax);

  const auto sd = seq_lens.dimensions();
  if (seq_lens.element_type() != ffi::DataType::S32) {
    return invalid_argument(kTarget, "seq_lens must be int32, got ", dtype_name(seq_lens.element_type()));
  }
  if (sd.size() != 1 || sd[0] != batch) {
    return invalid_argument(kTarget, "seq_lens must have shape (b,) with b = ", batch, " (from q), got ", shape_string(sd));
  }

  if (num_parts < 1) return invalid_argument(kTarget, "num_parts must be >= 1, got ", num_parts);
  if (!chunk_blocks_ok(chunk_blocks)) {
    return invalid_argument(kTarget, "chunk_blocks (batch_invariant's chunk in ", kBlockN,
                            "-token blocks) must be 0 or in [1, ", kMaxInvariantChunkBlocks, "], got ", chunk_blocks);
  }
  const bool invariant = chunk_blocks > 0;
  const auto schd = schedule.dimensions();
  if (schedule.element_type() != ffi::DataType::S32) {
    return invalid_argument(kTarget, "schedule must be int32, got ", dtype_name(schedule.element_type()));
  }
  const int64_t expected_schedule = schedule_size(batch, num_parts, invariant);
  if (schd.size() != 1 || (schd[0] != 0 && schd[0] != expected_schedule)) {
    return invalid_argument(kTarget, "schedule must have shape (0,) or (", invariant ? "invariant_" : "",
                            "schedule_size(b=", batch, ", num_parts=", num_parts, ") = ", expected_schedule,
                            ",) (a schedule made ", invariant ? "with" : "without", " batch_invariant), got ",
                            shape_string(schd));
  }

  if (ffi::Error e = check_out_lse(kTarget, out, lse, qdims); e.failure()) return e;
  if (ffi::Error e = check_softmax_scale(kTarget, softmax_scale); e.failure()) return e;

  // The `kernel` attribute (kernel_select.h). The CPU handler then ignores it (one CPU kernel).
  Kernel k;
  if (!kernel_from_attr(kernel, &k)) return invalid_argument(kTarget, kernel_attr_error(kernel));

  DecodeShape& d = *shape;
  d.batch = static_cast<int>(batch);
  d.seq_q = static_cast<int>(seq_q);
  d.heads_q = static_cast<int>(heads_q);
  d.rows = static_cast<int>(seq_q * heads_q);
  d.num_pages = static_cast<int>(num_pages);
  d.page_size = static_cast<int>(page_size);
  d.max_pages = static_cast<int>(max_pages);
  d.num_parts = num_parts;
  d.dtype = dtype == ffi::DataType::BF16 ? DType::kBF16 : DType::kF16;
  d.kv_format = fp8 ? KvFormat::kFp8 : KvFormat::kDense;
  d.schedule_given = schd[0] != 0;
  if (invariant) {
    const int64_t capacity = d.schedule_given ? -1 : static_cast<int64_t>(max_pages) * page_size;
    d.chunks = ChunkSpec{chunk_blocks, invariant_max_chunks(num_parts, chunk_blocks, capacity)};
  }
  return ffi::Error::Success();
}

// The DecodeProblem of a checked call: every field except the split-KV scratch pointers
// (partial_lse, partial_out), which are platform specific; `schedule` is null when
// the call passed none (plan it in the op).
inline DecodeProblem decode_problem(const DecodeShape& d, ffi::AnyBuffer q, ffi::AnyBuffer kv_cache,
                                  ffi::AnyBuffer block_table, ffi::AnyBuffer seq_lens, ffi::AnyBuffer schedule,
                                  ffi::AnyBuffer out, ffi::AnyBuffer lse, float softmax_scale, bool causal) {
  DecodeProblem p{};
  p.batch = d.batch;
  p.seq_q = d.seq_q;
  p.heads_q = d.heads_q;
  p.rows = d.rows;
  p.num_pages = d.num_pages;
  p.page_size = d.page_size;
  p.max_pages = d.max_pages;
  p.num_parts = d.num_parts;
  p.dtype = d.dtype;
  p.kv_format = d.kv_format;
  p.softmax_scale = softmax_scale;
  p.causal = causal;
  p.chunks = d.chunks;
  p.q = q.untyped_data();
  p.kv_cache = kv_cache.untyped_data();
  p.block_table = static_cast<const int32_t*>(block_table.untyped_data());
  p.seq_lens = static_cast<const int32_t*>(seq_lens.untyped_data());
  p.schedule = d.schedule_given ? static_cast<const int32_t*>(schedule.untyped_data()) : nullptr;
  p.out = out.untyped_data();
  p.lse = static_cast<float*>(lse.untyped_data());
  p.partial_lse = nullptr;
  p.partial_out = nullptr;
  return p;
}

// Checks the operand, result and attributes of jax_mla_decode_schedule; returns the batch size
// and the plan's ChunkSpec ({0, 0}: the default plans).
inline ffi::Error check_schedule(ffi::AnyBuffer seq_lens,  // (b,) s32
                                 ffi::AnyBuffer schedule,  // (schedule_size(b, num_parts, invariant),) s32
                                 int32_t num_parts, int32_t chunk_blocks, int* batch, ChunkSpec* chunks) {
  constexpr const char* kTarget = "jax_mla_decode_schedule";
  const auto sd = seq_lens.dimensions();
  if (seq_lens.element_type() != ffi::DataType::S32 || sd.size() != 1) {
    return invalid_argument(kTarget, "seq_lens must be an int32 vector (b,), got ", dtype_name(seq_lens.element_type()),
                            " ", shape_string(sd));
  }
  if (sd[0] > kIntMax) return invalid_argument(kTarget, "batch size ", sd[0], " exceeds ", kIntMax);
  if (num_parts < 1) return invalid_argument(kTarget, "num_parts must be >= 1, got ", num_parts);
  if (!chunk_blocks_ok(chunk_blocks)) {
    return invalid_argument(kTarget, "chunk_blocks (batch_invariant's chunk in ", kBlockN,
                            "-token blocks) must be 0 or in [1, ", kMaxInvariantChunkBlocks, "], got ", chunk_blocks);
  }
  const bool invariant = chunk_blocks > 0;
  const int64_t expected = schedule_size(sd[0], num_parts, invariant);
  const auto rd = schedule.dimensions();
  if (schedule.element_type() != ffi::DataType::S32 || rd.size() != 1 || rd[0] != expected) {
    return invalid_argument(kTarget, "schedule result must be int32 (", invariant ? "invariant_" : "",
                            "schedule_size(b=", sd[0], ", num_parts=", num_parts, ") = ", expected, ",), got ",
                            dtype_name(schedule.element_type()), " ", shape_string(rd));
  }
  *batch = static_cast<int>(sd[0]);
  // decode_schedule does not see the block table: S = num_parts (invariant_max_chunks).
  *chunks = invariant ? ChunkSpec{chunk_blocks, invariant_max_chunks(num_parts, chunk_blocks, -1)} : ChunkSpec{0, 0};
  return ffi::Error::Success();
}

}  // namespace ffi_args
}  // namespace jax_mla
