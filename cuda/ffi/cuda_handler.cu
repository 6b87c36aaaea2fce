// CUDA FFI handlers: decode the buffers and attributes, validate, fill DecodeProblem, select the
// kernel (runtime/device.h) and launch (runtime/decode_launch.h). No math and no device state here.
//
// Graph (XLA command buffer) compatibility: the execute stages allocate nothing (the split-KV
// scratch and the in-op schedule live in the `workspace` result XLA allocates), never synchronise
// the stream (the decode only asks whether the stream is capturing, which capture permits, to count
// it: runtime/call_stats.h), and read device state the initialize stage set up. Every CUDA target
// (jax_mla_decode_sparse's too, cuda_sparse_handler.cu) shares the initialize stage
// (runtime/device.h init_current_device: properties, kernel setup, the self-check), which
// allocates and synchronises on its own stream.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "common/launch.h"
#include "common/problem.h"
#include "common/workspace.h"
#include "ffi/cuda_errors.h"
#include "ffi/decode_args.h"
#include "ffi/handlers.h"
#include "runtime/call_stats.h"
#include "runtime/cuda_calls.h"
#include "runtime/decode_launch.h"
#include "runtime/device.h"

namespace ffi = ::xla::ffi;

namespace jax_mla {
namespace {

using ffi_args::invalid_argument;
using ffi_args::to_ffi;

// Checks that only the GPU kernels impose (the CPU kernel takes any page size).
ffi::Error check_gpu_limits(const ffi_args::DecodeShape& d, int64_t workspace_bytes) {
  constexpr const char* kTarget = "jax_mla_decode";
  const int ps = d.page_size;
  if (ps < kMinGpuPageSize || ps > kMaxGpuPageSize || (ps & (ps - 1)) != 0) {
    return invalid_argument(kTarget, "the GPU kernels need a power-of-two page size in [", kMinGpuPageSize, ", ",
                            kMaxGpuPageSize, "], got kv_cache page_size ", ps);
  }
  if (static_cast<int64_t>(d.num_pages) * ps > kIntMax) {
    return invalid_argument(kTarget, "kv_cache holds ", static_cast<int64_t>(d.num_pages) * ps,
                            " tokens; the GPU kernels address at most ", kIntMax);
  }
  if (!d.schedule_given && d.batch > kMaxScheduleBatch) {
    return invalid_argument(kTarget, "batch ", d.batch, " exceeds the device scheduler's limit ", kMaxScheduleBatch);
  }
  const int64_t need = workspace_layout(d.batch, d.rows, d.num_parts, d.chunks.max_chunks).total_bytes;
  if (workspace_bytes < need) {
    return invalid_argument(kTarget, "workspace has ", workspace_bytes, " bytes, needs ", need,
                            " (workspace_bytes(b=", d.batch, ", rows=", d.rows, ", num_parts=", d.num_parts,
                            ", max_chunks=", d.chunks.max_chunks, "))");
  }
  return ffi::Error::Success();
}

// Initialize stage of every CUDA target (also jax_mla_decode_sparse's): once per device.
ffi::Error InitializeImpl() { return to_ffi(init_current_device()); }

ffi::Error DecodeExecuteImpl(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer kv_cache, ffi::AnyBuffer block_table,
                             ffi::AnyBuffer seq_lens, ffi::AnyBuffer schedule, ffi::Result<ffi::AnyBuffer> out,
                             ffi::Result<ffi::AnyBuffer> lse, ffi::Result<ffi::AnyBuffer> workspace,
                             float softmax_scale, bool causal, int32_t num_parts, int32_t kernel,
                             int32_t chunk_blocks) {
  ffi_args::DecodeShape shape;
  if (ffi::Error e = ffi_args::check_decode(q, kv_cache, block_table, seq_lens, schedule, *out, *lse, softmax_scale,
                                            num_parts, kernel, chunk_blocks, &shape);
      e.failure()) {
    return e;
  }
  count_decode_call(stream_capturing(stream));
  if (shape.batch == 0) return ffi::Error::Success();  // nothing to launch (a grid of 0 CTAs is an error)
  if (ffi::Error e = check_gpu_limits(shape, static_cast<int64_t>(workspace->size_bytes())); e.failure()) return e;

  const DeviceState* device = nullptr;
  if (Status s = ready_device("jax_mla_decode", &device); !s.ok()) return to_ffi(s);
  // An FP8 cache only reaches a kernel that reads it (kernel_select.h kReadsFp8Cache).
  const KernelSelection sel = select_on(*device, kernel, shape.kv_format == KvFormat::kFp8);
  if (!sel.error.empty()) return invalid_argument("jax_mla_decode", sel.error);
  if (sel.needs_self_check) {
    return ffi::Error(ffi::ErrorCode::kInternal, "jax_mla_decode: the self-check did not run in the initialize stage");
  }

  DecodeProblem p =
      ffi_args::decode_problem(shape, q, kv_cache, block_table, seq_lens, schedule, *out, *lse, softmax_scale, causal);
  const WorkspaceScratch scratch = attach_workspace(p, workspace->untyped_data());
  const LaunchStatus st = launch_decode_kernel(sel.kernel, p, device->sm_count, scratch.merge_counters,
                                               scratch.schedule_scratch, stream);
  if (!st.ok()) return ffi_args::launch_error("jax_mla_decode", st);
  if (st.fused_merge) count_fused_merge_launch();
  return ffi::Error::Success();
}

ffi::Error ScheduleExecuteImpl(cudaStream_t stream, ffi::AnyBuffer seq_lens, ffi::Result<ffi::AnyBuffer> schedule,
                               int32_t num_parts, int32_t chunk_blocks) {
  int batch = 0;
  ChunkSpec chunks{0, 0};
  if (ffi::Error e = ffi_args::check_schedule(seq_lens, *schedule, num_parts, chunk_blocks, &batch, &chunks);
      e.failure()) {
    return e;
  }
  // An empty batch still has a schedule of num_parts empty parts: the kernel writes it (one CTA).
  if (batch > kMaxScheduleBatch) {
    return invalid_argument("jax_mla_decode_schedule", "batch ", batch, " exceeds the device scheduler's limit ",
                            kMaxScheduleBatch);
  }
  // The scheduler's shared-memory limit was raised by the initialize stage.
  const DeviceState* device = nullptr;
  if (Status s = ready_device("jax_mla_decode_schedule", &device); !s.ok()) return to_ffi(s);
  if (cudaError_t e = launch_schedule(static_cast<const int32_t*>(seq_lens.untyped_data()), batch, num_parts,
                                      static_cast<int32_t*>(schedule->untyped_data()), stream, nullptr, 0, chunks);
      e != cudaSuccess) {
    return to_ffi(cuda_status("scheduler launch", e));
  }
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jax_mla

XLA_FFI_DEFINE_HANDLER_SYMBOL(MlaDecodeCudaInitialize, jax_mla::InitializeImpl, ffi::Ffi::BindInitialize());

XLA_FFI_DEFINE_HANDLER_SYMBOL(MlaDecodeCudaExecute, jax_mla::DecodeExecuteImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // q            (b, s_q, h_q, 576)
                                  .Arg<ffi::AnyBuffer>()  // kv_cache     (num_pages, page_size, 576 | 656 u8)
                                  .Arg<ffi::AnyBuffer>()  // block_table  (b, max_pages) s32
                                  .Arg<ffi::AnyBuffer>()  // seq_lens     (b,) s32
                                  .Arg<ffi::AnyBuffer>()  // schedule     (0,) or (schedule_size,) s32
                                  .Ret<ffi::AnyBuffer>()  // out          (b, s_q, h_q, 512)
                                  .Ret<ffi::AnyBuffer>()  // lse          (b, s_q, h_q) f32
                                  .Ret<ffi::AnyBuffer>()  // workspace    (workspace_bytes,) u8
                                  .Attr<float>("softmax_scale")
                                  .Attr<bool>("causal")
                                  .Attr<int32_t>("num_parts")
                                  .Attr<int32_t>("kernel")         // runtime/kernel_select.h Kernel
                                  .Attr<int32_t>("chunk_blocks"),  // 0, or the batch-invariant plan's chunk
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(MlaDecodeScheduleCudaExecute, jax_mla::ScheduleExecuteImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // seq_lens (b,) s32
                                  .Ret<ffi::AnyBuffer>()  // schedule (schedule_size(b, num_parts, .),) s32
                                  .Attr<int32_t>("num_parts")
                                  .Attr<int32_t>("chunk_blocks"),
                              {ffi::Traits::kCmdBufferCompatible});
