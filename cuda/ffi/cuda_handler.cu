// CUDA FFI handlers: validate, pick the kernel for the device, launch. No math here.
//
// Graph (XLA command buffer) compatibility: the execute stage allocates nothing (the split-KV
// scratch and the in-op schedule live in the `workspace` result XLA allocates), never synchronises
// the stream (it only asks whether the stream is capturing, which capture permits, to count it:
// cuda_call_stats), and reads device state cached by the initialize stage.
//
// Kernel choice (ffi/kernel_select.h): the `kernel` attribute, then JAX_MLA_KERNEL, then the
// automatic choice by compute capability. The initialize stage sets up every kernel the device can
// run and, once per device, runs the self-check that the automatic choice needs (sm100 on 10.x, or
// sm90 on 9.0 with JAX_MLA_SELFCHECK=force|fault) -- it allocates and synchronises its own stream,
// which the execute stage never does. JAX_MLA_KERNEL and JAX_MLA_SELFCHECK are read once per
// process, at the first initialization.
#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "common/launch.h"
#include "common/problem.h"
#include "common/scheduler.h"
#include "common/workspace.h"
#include "decode_args.h"
#include "ffi/decode_launch.h"
#include "ffi/device_query.h"
#include "ffi/kernel_info.h"
#include "ffi/kernel_select.h"
#include "ffi/self_check.h"
#include "handlers.h"

namespace ffi = ::xla::ffi;

namespace jax_mla {
namespace {

using ffi_args::invalid_argument;

struct DeviceInfo {
  std::atomic<bool> ready{false};  // set last, after everything below (release / acquire)
  int sm_count = 0;
  int cc_major = 0, cc_minor = 0;
  SelfCheckOutcome self_check = SelfCheckOutcome::kNotRun;
  Kernel self_check_kernel = Kernel::kAuto;  // the kernel that was checked (kAuto: none)
  std::string self_check_detail;
};

constexpr int kMaxDevices = 64;
std::array<DeviceInfo, kMaxDevices> g_devices;
std::mutex g_devices_mutex;

std::atomic<long long> g_decode_calls{0};
std::atomic<long long> g_decode_captured{0};
std::atomic<long long> g_sm90_fused_merge_launches{0};

// The environment as this process read it, once.
struct ProcessEnv {
  std::string kernel;      // JAX_MLA_KERNEL
  std::string self_check;  // JAX_MLA_SELFCHECK
  SelfCheckMode mode = SelfCheckMode::kDefault;
  bool mode_valid = true;
};

const ProcessEnv& process_env() {
  static const ProcessEnv env = [] {
    ProcessEnv e;
    const char* k = std::getenv("JAX_MLA_KERNEL");
    const char* c = std::getenv("JAX_MLA_SELFCHECK");
    e.kernel = k ? k : "";
    e.self_check = c ? c : "";
    e.mode_valid = self_check_mode_from_env(e.self_check.c_str(), &e.mode);
    return e;
  }();
  return env;
}

ffi::Error cuda_error(const char* what, cudaError_t err) {
  return ffi::Error(ffi::ErrorCode::kInternal,
                    std::string("jax_mla: ") + what + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

// Once per device: properties, kernel setup, and the self-check auto needs. Under the mutex.
ffi::Error init_device_locked(int device) {
  DeviceInfo& info = g_devices[device];
  if (info.ready.load(std::memory_order_acquire)) return ffi::Error::Success();
  const ProcessEnv& env = process_env();
  if (!env.mode_valid) {
    return ffi::Error(ffi::ErrorCode::kInvalidArgument, "jax_mla: " + self_check_env_error(env.self_check.c_str()));
  }
  cudaDeviceProp prop;
  if (cudaError_t e = cudaGetDeviceProperties(&prop, device); e != cudaSuccess) {
    return cuda_error("cudaGetDeviceProperties", e);
  }
  if (prop.major < 8) {
    return ffi::Error(ffi::ErrorCode::kUnimplemented,
                      "jax_mla: no CUDA kernel for compute capability " + compute_capability_string(prop.major, prop.minor) +
                          " (CUDA device " + std::to_string(device) + "): jax_mla's GPU kernels need 8.0 or newer");
  }
  info.sm_count = prop.multiProcessorCount;
  info.cc_major = prop.major;
  info.cc_minor = prop.minor;
  if (cudaError_t e = setup_schedule_kernel(); e != cudaSuccess) return cuda_error("scheduler setup", e);
  if (cudaError_t e = setup_decode_kernels(prop.major, prop.minor); e != cudaSuccess) {
    return cuda_error("decode kernel setup", e);
  }
  const AutoCandidate candidate = auto_candidate(prop.major, prop.minor, built_kernels(), env.mode);
  if (candidate.needs_self_check) {
    const SelfCheckReport report = run_self_check(candidate.kernel, env.mode == SelfCheckMode::kFault);
    info.self_check_kernel = candidate.kernel;
    info.self_check = report.passed ? SelfCheckOutcome::kPassed : SelfCheckOutcome::kFailed;
    info.self_check_detail = report.detail;
    if (!report.passed) {
      std::fprintf(stderr,
                   "jax_mla: WARNING: the %s kernel failed its self-check against the portable kernel on CUDA device %d "
                   "(compute capability %d.%d): %s; kernel=\"auto\" uses the portable kernel on this device\n",
                   kernel_name(candidate.kernel), device, prop.major, prop.minor, report.detail.c_str());
      std::fflush(stderr);
    }
  }
  info.ready.store(true, std::memory_order_release);
  return ffi::Error::Success();
}

ffi::Error init_device(int device) {
  if (device < 0 || device >= kMaxDevices) {
    return ffi::Error(ffi::ErrorCode::kUnimplemented, "jax_mla: device ordinal above 63 is not supported");
  }
  if (g_devices[device].ready.load(std::memory_order_acquire)) return ffi::Error::Success();
  std::lock_guard<std::mutex> lock(g_devices_mutex);
  return init_device_locked(device);
}

// Initialize stage: once per device (see init_device_locked).
ffi::Error InitializeImpl() {
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return cuda_error("cudaGetDevice", e);
  return init_device(device);
}

KernelSelection select_for(const DeviceInfo& info, int32_t kernel_attr) {
  const ProcessEnv& env = process_env();
  return select_kernel(info.cc_major, info.cc_minor, kernel_attr, env.kernel.c_str(), built_kernels(), env.mode,
                       info.self_check);
}

// Checks that only the GPU kernels impose (the CPU kernel takes any page size).
ffi::Error check_gpu_limits(const DecodeProblem& p, int64_t workspace_bytes, bool schedule_in_op) {
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
                             float softmax_scale, bool causal, int32_t num_parts, int32_t kernel) {
  DecodeProblem p;
  if (ffi::Error e = ffi_args::check_decode(q, kv_cache, block_table, seq_lens, schedule, *out, *lse, softmax_scale,
                                            causal, num_parts, &p);
      e.failure()) {
    return e;
  }
  if (ffi::Error e = ffi_args::check_kernel(kernel); e.failure()) return e;
  g_decode_calls.fetch_add(1, std::memory_order_relaxed);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) == cudaSuccess && capture == cudaStreamCaptureStatusActive) {
    g_decode_captured.fetch_add(1, std::memory_order_relaxed);
  }
  if (p.batch == 0) return ffi::Error::Success();  // nothing to launch (a grid of 0 CTAs is an error)
  const bool schedule_in_op = p.schedule == nullptr;
  if (ffi::Error e = check_gpu_limits(p, static_cast<int64_t>(workspace->size_bytes()), schedule_in_op); e.failure()) {
    return e;
  }

  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return cuda_error("cudaGetDevice", e);
  if (device < 0 || device >= kMaxDevices || !g_devices[device].ready.load(std::memory_order_acquire)) {
    return ffi::Error(ffi::ErrorCode::kInternal, "jax_mla_decode: the initialize stage did not run on this device");
  }
  const KernelSelection sel = select_for(g_devices[device], kernel);
  if (!sel.error.empty()) return ffi::Error(ffi::ErrorCode::kInvalidArgument, "jax_mla_decode: " + sel.error);
  if (sel.needs_self_check) {
    return ffi::Error(ffi::ErrorCode::kInternal, "jax_mla_decode: the self-check did not run in the initialize stage");
  }

  uint8_t* ws = static_cast<uint8_t*>(workspace->untyped_data());
  const WorkspaceLayout layout = workspace_layout(p.batch, p.rows, p.num_parts);
  p.partial_lse = reinterpret_cast<float*>(ws + layout.partial_lse_offset);
  p.partial_out = reinterpret_cast<float*>(ws + layout.partial_out_offset);
  const LaunchStatus st = launch_decode_kernel(sel.kernel, p, g_devices[device].sm_count,
                                               reinterpret_cast<int*>(ws + layout.merge_counters_offset),
                                               reinterpret_cast<int32_t*>(ws + layout.schedule_offset), stream);
  if (!st.ok()) {
    if (st.error != cudaSuccess) return cuda_error(st.what, st.error);
    return ffi::Error(ffi::ErrorCode::kInternal, std::string("jax_mla_decode: ") + st.what);
  }
  if (st.fused_merge) g_sm90_fused_merge_launches.fetch_add(1, std::memory_order_relaxed);
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
  if (device < 0 || device >= kMaxDevices || !g_devices[device].ready.load(std::memory_order_acquire)) {
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

CudaCallStats cuda_call_stats() {
  CudaCallStats st{g_decode_calls.load(std::memory_order_relaxed), g_decode_captured.load(std::memory_order_relaxed),
                   g_sm90_fused_merge_launches.load(std::memory_order_relaxed)};
  return st;
}

DeviceKernelInfo device_kernel_info(int ordinal) {
  DeviceKernelInfo r;
  const ProcessEnv& env = process_env();
  r.env_kernel = env.kernel;
  r.env_self_check = env.self_check;
  if (ordinal < 0 || ordinal >= kMaxDevices) {
    r.error = "jax_mla: device ordinal " + std::to_string(ordinal) + " is not supported (0 to 63)";
    return r;
  }
  if (cudaError_t e = cudaSetDevice(ordinal); e != cudaSuccess) {
    cudaGetLastError();
    r.error = std::string("jax_mla: cudaSetDevice(") + std::to_string(ordinal) + "): " + cudaGetErrorName(e);
    return r;
  }
  if (ffi::Error e = init_device(ordinal); e.failure()) {
    r.error = e.message();
    return r;
  }
  const DeviceInfo& info = g_devices[ordinal];
  r.cc_major = info.cc_major;
  r.cc_minor = info.cc_minor;
  r.self_check = kSelfCheckNames[static_cast<int>(info.self_check)];
  r.self_check_kernel = info.self_check_kernel == Kernel::kAuto ? "" : kernel_name(info.self_check_kernel);
  r.self_check_detail = info.self_check_detail;
  const KernelSelection sel = select_for(info, static_cast<int32_t>(Kernel::kAuto));
  if (!sel.error.empty()) {
    r.error = "jax_mla: " + sel.error;
  } else {
    r.kernel = kernel_name(sel.kernel);
    r.fell_back = sel.fell_back;
  }
  return r;
}

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
                                  .Attr<int32_t>("num_parts")
                                  .Attr<int32_t>("kernel"),  // ffi/kernel_select.h Kernel
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(MlaDecodeScheduleCudaExecute, jax_mla::ScheduleExecuteImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // seq_lens (b,) s32
                                  .Ret<ffi::AnyBuffer>()  // schedule (schedule_size(b, num_parts),) s32
                                  .Attr<int32_t>("num_parts"),
                              {ffi::Traits::kCmdBufferCompatible});
