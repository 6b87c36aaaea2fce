// CUDA FFI handlers: validate, pick the kernel for the device, launch. No math here.
//
// Graph (XLA command buffer) compatibility: the execute stage allocates nothing (the split-KV
// scratch and the in-op schedule live in the `workspace` result XLA allocates), never synchronises
// or queries the stream, and reads device properties cached by the initialize stage.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <array>
#include <cmath>
#include <mutex>

#include "common/launch.h"
#include "common/params.h"
#include "common/scheduler.h"
#include "common/tensor_map.h"
#include "common/workspace.h"
#include "decode_args.h"
#include "handlers.h"
#include "sm90/launch.h"

namespace ffi = ::xla::ffi;

namespace jax_mla {
namespace {

using ffi_args::invalid_argument;

struct DeviceInfo {
  bool ready = false;
  int sm_count = 0;
  int cc_major = 0, cc_minor = 0;
};

constexpr int kMaxDevices = 64;
std::array<DeviceInfo, kMaxDevices> g_devices;
std::mutex g_devices_mutex;

ffi::Error cuda_error(const char* what, cudaError_t err) {
  return ffi::Error(ffi::ErrorCode::kInternal,
                    std::string("jax_mla: ") + what + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

// Initialize stage: once per device, read its properties and raise the kernels' shared-memory limits.
ffi::Error InitializeImpl() {
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return cuda_error("cudaGetDevice", e);
  if (device < 0 || device >= kMaxDevices) {
    return ffi::Error(ffi::ErrorCode::kUnimplemented, "jax_mla: device ordinal above 63 is not supported");
  }
  std::lock_guard<std::mutex> lock(g_devices_mutex);
  DeviceInfo& info = g_devices[device];
  if (info.ready) return ffi::Error::Success();
  cudaDeviceProp prop;
  if (cudaError_t e = cudaGetDeviceProperties(&prop, device); e != cudaSuccess) {
    return cuda_error("cudaGetDeviceProperties", e);
  }
  info.sm_count = prop.multiProcessorCount;
  info.cc_major = prop.major;
  info.cc_minor = prop.minor;
  if (cudaError_t e = setup_schedule_kernel(); e != cudaSuccess) return cuda_error("scheduler setup", e);
  if (info.cc_major == 9 && info.cc_minor == 0) {
    if (cudaError_t e = sm90::setup_decode<__nv_bfloat16>(); e != cudaSuccess) return cuda_error("sm90 setup", e);
    if (cudaError_t e = sm90::setup_decode<__half>(); e != cudaSuccess) return cuda_error("sm90 setup", e);
  }
  info.ready = true;
  return ffi::Error::Success();
}

// Checks that only the GPU kernels impose (the CPU kernel takes any page size).
ffi::Error check_gpu_limits(const DecodeParams& p, int64_t workspace_bytes, bool schedule_in_op) {
  constexpr const char* kTarget = "jax_mla_decode";
  const int ps = p.page_size;
  if (ps < kMinGpuPageSize || ps > kMaxGpuPageSize || (ps & (ps - 1)) != 0) {
    return invalid_argument(kTarget, "the GPU kernels need a power-of-two page size in [", kMinGpuPageSize, ", ",
                            kMaxGpuPageSize, "], got kv_cache page_size ", ps);
  }
  if (static_cast<int64_t>(p.num_pages) * ps > ffi_args::kIntMax) {
    return invalid_argument(kTarget, "kv_cache holds ", static_cast<int64_t>(p.num_pages) * ps,
                            " tokens; the GPU kernels address at most ", ffi_args::kIntMax);
  }
  if (schedule_in_op && p.batch > kMaxScheduleBatch) {
    return invalid_argument(kTarget, "batch ", p.batch, " exceeds the device scheduler's limit ", kMaxScheduleBatch);
  }
  const int64_t need = workspace_layout(p.batch, p.rows, p.num_parts).total_bytes;
  if (workspace_bytes < need) {
    return invalid_argument(kTarget, "workspace has ", workspace_bytes, " bytes, needs ", need,
                            " (workspace_bytes(b=", p.batch, ", rows=", p.rows, ", num_parts=", p.num_parts, "))");
  }
  return ffi::Error::Success();
}

ffi::Error DecodeExecuteImpl(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer kv_cache, ffi::AnyBuffer block_table,
                             ffi::AnyBuffer seq_lens, ffi::AnyBuffer schedule, ffi::Result<ffi::AnyBuffer> out,
                             ffi::Result<ffi::AnyBuffer> lse, ffi::Result<ffi::AnyBuffer> workspace,
                             float softmax_scale, bool causal, int32_t num_parts) {
  DecodeParams p;
  if (ffi::Error e = ffi_args::check_decode(q, kv_cache, block_table, seq_lens, schedule, *out, *lse, softmax_scale,
                                            causal, num_parts, &p);
      e.failure()) {
    return e;
  }
  if (p.batch == 0) return ffi::Error::Success();  // nothing to launch (a grid of 0 CTAs is an error)
  const bool schedule_in_op = p.schedule == nullptr;
  if (ffi::Error e = check_gpu_limits(p, static_cast<int64_t>(workspace->size_bytes()), schedule_in_op); e.failure()) {
    return e;
  }

  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return cuda_error("cudaGetDevice", e);
  const DeviceInfo& info = g_devices[device];
  if (!info.ready) {
    return ffi::Error(ffi::ErrorCode::kInternal, "jax_mla_decode: the initialize stage did not run on this device");
  }
  if (!(info.cc_major == 9 && info.cc_minor == 0)) {
    return ffi::Error(ffi::ErrorCode::kUnimplemented,
                      "jax_mla_decode: no CUDA kernel for compute capability " + std::to_string(info.cc_major) + "." +
                          std::to_string(info.cc_minor) + " in this build (the SM90 kernel needs 9.0)");
  }

  uint8_t* ws = static_cast<uint8_t*>(workspace->untyped_data());
  const WorkspaceLayout layout = workspace_layout(p.batch, p.rows, p.num_parts);
  p.partial_lse = reinterpret_cast<float*>(ws + layout.partial_lse_offset);
  p.partial_out = reinterpret_cast<float*>(ws + layout.partial_out_offset);

  // (b * s_q * h_q, 576) for Q; (num_pages * page_size, 576) for the cache.
  CUtensorMap q_map, kv_map;
  const char* map_error = nullptr;
  if (!make_tensor_map_2d(&q_map, p.q, p.dtype, static_cast<uint64_t>(p.batch) * p.rows, kHeadDimQK, kHeadDimQK,
                          kBlockM, 64, &map_error) ||
      !make_tensor_map_2d(&kv_map, p.kv_cache, p.dtype, static_cast<uint64_t>(p.num_pages) * p.page_size,
                          kHeadDimQK, kHeadDimQK, p.page_size < kBlockN ? p.page_size : kBlockN, 64, &map_error)) {
    return ffi::Error(ffi::ErrorCode::kInternal, std::string("jax_mla_decode: ") + map_error);
  }

  if (schedule_in_op) {
    int32_t* plan = reinterpret_cast<int32_t*>(ws + layout.schedule_offset);
    if (cudaError_t e = launch_schedule(p.seq_lens, p.batch, p.num_parts, plan, stream); e != cudaSuccess) {
      return cuda_error("scheduler launch", e);
    }
    p.schedule = plan;
  }
  cudaError_t e = p.dtype == DType::kBF16 ? sm90::launch_decode<__nv_bfloat16>(p, q_map, kv_map, stream)
                                          : sm90::launch_decode<__half>(p, q_map, kv_map, stream);
  if (e != cudaSuccess) return cuda_error("decode kernel launch", e);
  if ((e = launch_combine(p, /*programmatic=*/true, stream)) != cudaSuccess) return cuda_error("combine kernel launch", e);
  return ffi::Error::Success();
}

ffi::Error ScheduleExecuteImpl(cudaStream_t stream, ffi::AnyBuffer seq_lens, ffi::Result<ffi::AnyBuffer> schedule,
                               int32_t num_parts) {
  int batch = 0;
  if (ffi::Error e = ffi_args::check_schedule(seq_lens, *schedule, num_parts, &batch); e.failure()) return e;
  // An empty batch still has a schedule of num_parts empty parts: the kernel writes it (one CTA).
  if (batch > kMaxScheduleBatch) {
    return invalid_argument("jax_mla_decode_schedule", "batch ", batch, " exceeds the device scheduler's limit ",
                            kMaxScheduleBatch);
  }
  // The scheduler's shared-memory limit was raised by the initialize stage (both targets have it).
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return cuda_error("cudaGetDevice", e);
  if (!g_devices[device].ready) {
    return ffi::Error(ffi::ErrorCode::kInternal, "jax_mla_decode_schedule: the initialize stage did not run");
  }
  if (cudaError_t e = launch_schedule(static_cast<const int32_t*>(seq_lens.untyped_data()), batch, num_parts,
                                      static_cast<int32_t*>(schedule->untyped_data()), stream);
      e != cudaSuccess) {
    return cuda_error("scheduler launch", e);
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
                                  .Arg<ffi::AnyBuffer>()  // kv_cache     (num_pages, page_size, 576)
                                  .Arg<ffi::AnyBuffer>()  // block_table  (b, max_pages) s32
                                  .Arg<ffi::AnyBuffer>()  // seq_lens     (b,) s32
                                  .Arg<ffi::AnyBuffer>()  // schedule     (0,) or (schedule_size,) s32
                                  .Ret<ffi::AnyBuffer>()  // out          (b, s_q, h_q, 512)
                                  .Ret<ffi::AnyBuffer>()  // lse          (b, s_q, h_q) f32
                                  .Ret<ffi::AnyBuffer>()  // workspace    (workspace_bytes,) u8
                                  .Attr<float>("softmax_scale")
                                  .Attr<bool>("causal")
                                  .Attr<int32_t>("num_parts"),
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(MlaDecodeScheduleCudaExecute, jax_mla::ScheduleExecuteImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // seq_lens (b,) s32
                                  .Ret<ffi::AnyBuffer>()  // schedule (schedule_size(b, num_parts),) s32
                                  .Attr<int32_t>("num_parts"),
                              {ffi::Traits::kCmdBufferCompatible});
