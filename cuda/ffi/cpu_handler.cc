// XLA FFI handlers of the "cpu" platform: jax_mla_decode and jax_mla_decode_schedule.
//
// The handlers only validate, fill DecodeProblem and call the CPU kernel (cuda/cpu). Unlike the
// GPU handlers they can read the data on the host, so the run-time checks (seq_lens against
// the block table, page ids, a caller-provided schedule) end the op with an error instead of
// producing NaN rows. A value of JAX_MLA_CPU_ISA that runtime/settings.h does not accept fails
// every decode.
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "common/problem.h"
#include "common/scheduler.h"
#include "cpu/decode_cpu.h"
#include "ffi/decode_args.h"
#include "ffi/handlers.h"
#include "runtime/settings.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jax_mla {
namespace {

using ffi_args::invalid_argument;

constexpr const char* kDecodeTarget = "jax_mla_decode";

// Every request's length fits its block-table row, and every page it reads exists.
ffi::Error check_requests(const DecodeProblem& p) {
  const int64_t capacity = static_cast<int64_t>(p.max_pages) * p.page_size;
  for (int r = 0; r < p.batch; ++r) {
    const int64_t seq_len = p.seq_lens[r];
    if (seq_len < 0) return invalid_argument(kDecodeTarget, "seq_lens[", r, "] = ", seq_len, " is negative");
    if (seq_len > capacity) {
      return invalid_argument(kDecodeTarget, "seq_lens[", r, "] = ", seq_len, " exceeds block_table capacity ",
                              p.max_pages, " pages x ", p.page_size, " = ", capacity);
    }
    const int64_t pages_read = (seq_len + p.page_size - 1) / p.page_size;
    const int32_t* row = p.block_table + static_cast<int64_t>(r) * p.max_pages;  // (max_pages)
    for (int64_t i = 0; i < pages_read; ++i) {
      if (row[i] < 0 || row[i] >= p.num_pages) {
        return invalid_argument(kDecodeTarget, "block_table[", r, ", ", i, "] = ", row[i],
                                " is not a page of kv_cache (num_pages = ", p.num_pages, "); request ", r,
                                " reads its first ", pages_read, " pages (seq_lens[", r, "] = ", seq_len, ")");
      }
    }
  }
  return ffi::Error::Success();
}

ffi::Error decode_cpu_impl(ffi::AnyBuffer q,            // (b, s_q, h_q, 576) bf16 | f16
                           ffi::AnyBuffer kv_cache,     // (num_pages, page_size, 576) q's dtype | (..., 656) u8
                           ffi::AnyBuffer block_table,  // (b, max_pages) s32
                           ffi::AnyBuffer seq_lens,     // (b,) s32
                           ffi::AnyBuffer schedule,     // (0,) or (schedule_size(b, num_parts),) s32
                           ffi::Result<ffi::AnyBuffer> out,  // (b, s_q, h_q, 512) q's dtype
                           ffi::Result<ffi::AnyBuffer> lse,  // (b, s_q, h_q) f32
                           float softmax_scale, bool causal, int32_t num_parts,
                           int32_t kernel,  // which GPU kernel: validated, then ignored here
                           int32_t chunk_blocks) {  // 0, or the batch-invariant plan's chunk
  ffi_args::DecodeShape shape;
  if (ffi::Error e = ffi_args::check_decode(q, kv_cache, block_table, seq_lens, schedule, *out, *lse, softmax_scale,
                                            num_parts, kernel, chunk_blocks, &shape);
      e.failure()) {
    return e;
  }
  const Setting<CpuIsa>& isa = settings().cpu_isa;
  if (!isa.ok()) return invalid_argument(kDecodeTarget, isa.error);
  DecodeProblem p = ffi_args::decode_problem(shape, q, kv_cache, block_table, seq_lens, schedule, *out, *lse,
                                           softmax_scale, causal);
  if (p.batch == 0) return ffi::Error::Success();
  if (ffi::Error e = check_requests(p); e.failure()) return e;

  try {
    // The plan for these seq_lens. A caller-provided schedule must be exactly this array:
    // anything else would make the kernel skip keys or write outside the partial buffers.
    const int64_t size = schedule_size(p.batch, p.num_parts, p.chunks.invariant());
    std::vector<int64_t> cost_prefix(static_cast<size_t>(p.batch) + 1);  // (b + 1)
    std::vector<int32_t> plan(static_cast<size_t>(size));                 // (schedule_size)
    plan_schedule_host(p.seq_lens, p.batch, p.num_parts, cost_prefix.data(), plan.data(), p.chunks);
    if (p.schedule != nullptr) {
      for (int64_t i = 0; i < size; ++i) {
        if (p.schedule[i] != plan[i]) {
          return invalid_argument(kDecodeTarget, "schedule does not match seq_lens and num_parts = ", p.num_parts,
                                  p.chunks.invariant() ? " with batch_invariant's chunk of " : "",
                                  p.chunks.invariant() ? std::to_string(p.chunks.chunk_blocks * kBlockN) : "",
                                  p.chunks.invariant() ? " tokens" : "", " (element ", i, " is ", p.schedule[i],
                                  ", expected ", plan[i], "); pass the schedule computed from these seq_lens",
                                  p.chunks.invariant() ? " and the same invariant_chunk" : "");
        }
      }
    }
    p.schedule = plan.data();

    // Only the slots the plan uses are touched: split_offsets[b] of them.
    const int64_t slots = plan[static_cast<size_t>(p.num_parts) * kPartFields + p.batch];
    std::unique_ptr<float[]> partial_lse(new float[slots * p.rows]);              // (slots, rows)
    std::unique_ptr<float[]> partial_out(new float[slots * p.rows * kHeadDimV]);  // (slots, rows, 512)
    p.partial_lse = partial_lse.get();
    p.partial_out = partial_out.get();

    decode_cpu(p, /*baseline_gemm=*/isa.value == CpuIsa::kGeneric);
  } catch (const std::bad_alloc&) {
    return ffi::Error(ffi::ErrorCode::kResourceExhausted, "jax_mla_decode: out of host memory for the split-KV scratch");
  }
  return ffi::Error::Success();
}

ffi::Error decode_schedule_cpu_impl(ffi::AnyBuffer seq_lens,               // (b,) s32
                                    ffi::Result<ffi::AnyBuffer> schedule,  // (schedule_size(b, num_parts, .),) s32
                                    int32_t num_parts, int32_t chunk_blocks) {
  int batch = 0;
  ChunkSpec chunks{0, 0};
  if (ffi::Error e = ffi_args::check_schedule(seq_lens, *schedule, num_parts, chunk_blocks, &batch, &chunks);
      e.failure()) {
    return e;
  }
  try {
    std::vector<int64_t> cost_prefix(static_cast<size_t>(batch) + 1);  // (b + 1)
    plan_schedule_host(static_cast<const int32_t*>(seq_lens.untyped_data()), batch, num_parts, cost_prefix.data(),
                       static_cast<int32_t*>(schedule->untyped_data()), chunks);
  } catch (const std::bad_alloc&) {
    return ffi::Error(ffi::ErrorCode::kResourceExhausted, "jax_mla_decode_schedule: out of host memory");
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jax_mla

XLA_FFI_DEFINE_HANDLER_SYMBOL(MlaDecodeCpu, jax_mla::decode_cpu_impl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // q
                                  .Arg<ffi::AnyBuffer>()  // kv_cache
                                  .Arg<ffi::AnyBuffer>()  // block_table
                                  .Arg<ffi::AnyBuffer>()  // seq_lens
                                  .Arg<ffi::AnyBuffer>()  // schedule
                                  .Ret<ffi::AnyBuffer>()  // out
                                  .Ret<ffi::AnyBuffer>()  // lse
                                  .Attr<float>("softmax_scale")
                                  .Attr<bool>("causal")
                                  .Attr<int32_t>("num_parts")
                                  .Attr<int32_t>("kernel")
                                  .Attr<int32_t>("chunk_blocks"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(MlaDecodeScheduleCpu, jax_mla::decode_schedule_cpu_impl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // seq_lens
                                  .Ret<ffi::AnyBuffer>()  // schedule
                                  .Attr<int32_t>("num_parts")
                                  .Attr<int32_t>("chunk_blocks"));
