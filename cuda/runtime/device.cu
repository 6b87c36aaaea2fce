// See device.h.
#include "runtime/device.h"

#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>

#include "common/launch.h"
#include "runtime/cuda_calls.h"
#include "runtime/decode_launch.h"
#include "runtime/self_check.h"
#include "runtime/settings.h"

namespace jax_mla {
namespace {

struct DeviceSlot {
  std::atomic<bool> ready{false};  // set last, after `state` (release / acquire)
  DeviceState state;
};

constexpr int kMaxDevices = 64;
std::array<DeviceSlot, kMaxDevices> g_devices;
std::mutex g_devices_mutex;

Status error(Status::Code code, std::string message) { return Status{code, std::move(message)}; }

// Once per device: properties, kernel setup, and the self-check auto needs. Under the mutex.
Status init_device_locked(int device) {
  DeviceSlot& slot = g_devices[device];
  if (slot.ready.load(std::memory_order_acquire)) return Status{};
  const Settings& env = settings();
  if (!env.self_check.ok()) return error(Status::Code::kInvalidArgument, "jax_mla: " + env.self_check.error);
  cudaDeviceProp prop;
  if (cudaError_t e = cudaGetDeviceProperties(&prop, device); e != cudaSuccess) {
    return cuda_status("cudaGetDeviceProperties", e);
  }
  if (prop.major < 8) {
    return error(Status::Code::kUnimplemented,
                 "jax_mla: no CUDA kernel for compute capability " + compute_capability_string(prop.major, prop.minor) +
                     " (CUDA device " + std::to_string(device) + "): jax_mla's GPU kernels need 8.0 or newer");
  }
  DeviceState& info = slot.state;
  info.sm_count = prop.multiProcessorCount;
  info.cc_major = prop.major;
  info.cc_minor = prop.minor;
  if (cudaError_t e = setup_schedule_kernel(); e != cudaSuccess) return cuda_status("scheduler setup", e);
  if (cudaError_t e = setup_decode_kernels(prop.major, prop.minor); e != cudaSuccess) {
    return cuda_status("decode kernel setup", e);
  }
  const BuiltKernels built = built_kernels();
  if (prop.major == 10 && ((prop.minor == 0 && built.sm100) || (prop.minor == 3 && built.sm103))) {
    if (cudaError_t e = setup_sm100_kernel(); e != cudaSuccess) {
      cudaGetLastError();  // not sticky: the portable kernel still runs on this context
      info.sm100_setup_error = std::string("setup failed: ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
    }
  }
  const AutoCandidate candidate = auto_candidate(prop.major, prop.minor, built, env.self_check.value);
  if (candidate.needs_self_check) {
    SelfCheckReport report;
    if (candidate.kernel == Kernel::kSm100 && !info.sm100_setup_error.empty()) {
      report.detail = info.sm100_setup_error;  // a failed check, not a failed initialization
    } else {
      report = run_self_check(candidate.kernel, env.self_check.value);
    }
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
  slot.ready.store(true, std::memory_order_release);
  return Status{};
}

Status init_device(int device) {
  if (device < 0 || device >= kMaxDevices) {
    return error(Status::Code::kUnimplemented, "jax_mla: device ordinal above 63 is not supported");
  }
  if (g_devices[device].ready.load(std::memory_order_acquire)) return Status{};
  std::lock_guard<std::mutex> lock(g_devices_mutex);
  return init_device_locked(device);
}

}  // namespace

Status cuda_status(const char* what, cudaError_t err) {
  return error(Status::Code::kInternal,
               std::string("jax_mla: ") + what + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

Status init_current_device() {
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return cuda_status("cudaGetDevice", e);
  return init_device(device);
}

Status ready_device(const char* target, const DeviceState** state) {
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return cuda_status("cudaGetDevice", e);
  if (device < 0 || device >= kMaxDevices || !g_devices[device].ready.load(std::memory_order_acquire)) {
    return error(Status::Code::kInternal, std::string(target) + ": the initialize stage did not run on this device");
  }
  *state = &g_devices[device].state;
  return Status{};
}

KernelSelection select_on(const DeviceState& state, int32_t kernel_attr, bool fp8_cache) {
  KernelSelection sel = select_kernel(state.cc_major, state.cc_minor, kernel_attr, settings(), built_kernels(),
                                      state.self_check, fp8_cache);
  // Auto never gets here with sm100 after a failed setup (its self-check failed); an explicit request does.
  if (sel.ok() && sel.kernel == Kernel::kSm100 && !state.sm100_setup_error.empty()) {
    sel.error = "kernel 'sm100' cannot run on this device: its " + state.sm100_setup_error;
  }
  return sel;
}

bool stream_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(stream, &capture) == cudaSuccess && capture == cudaStreamCaptureStatusActive;
}

int cuda_sm_count() {
  // With the static cudart these calls load libcuda lazily; without a driver they return an
  // error code (cudaErrorInsufficientDriver / cudaErrorNoDevice) instead of failing to load.
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1) {
    cudaGetLastError();  // reset the last-error state so it does not surface in an unrelated check
    return 0;
  }
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return sms;
}

DeviceKernelInfo device_kernel_info(int ordinal) {
  DeviceKernelInfo r;
  const Settings& env = settings();
  r.env_kernel = env.kernel.text;
  r.env_self_check = env.self_check.text;
  if (ordinal < 0 || ordinal >= kMaxDevices) {
    r.error = "jax_mla: device ordinal " + std::to_string(ordinal) + " is not supported (0 to 63)";
    return r;
  }
  if (cudaError_t e = cudaSetDevice(ordinal); e != cudaSuccess) {
    cudaGetLastError();
    r.error = std::string("jax_mla: cudaSetDevice(") + std::to_string(ordinal) + "): " + cudaGetErrorName(e);
    return r;
  }
  if (Status s = init_device(ordinal); !s.ok()) {
    r.error = s.message;
    return r;
  }
  const DeviceState& info = g_devices[ordinal].state;
  r.cc_major = info.cc_major;
  r.cc_minor = info.cc_minor;
  r.self_check = kSelfCheckNames[static_cast<int>(info.self_check)];
  r.self_check_kernel = info.self_check_kernel == Kernel::kAuto ? "" : kernel_name(info.self_check_kernel);
  r.self_check_detail = info.self_check_detail;
  const KernelSelection sel = select_on(info, static_cast<int32_t>(Kernel::kAuto));
  if (!sel.error.empty()) {
    r.error = "jax_mla: " + sel.error;
  } else {
    r.kernel = kernel_name(sel.kernel);
    r.fell_back = sel.fell_back;
    const KernelSelection fp8 = select_on(info, static_cast<int32_t>(Kernel::kAuto), /*fp8_cache=*/true);
    r.fp8_kernel = fp8.ok() ? kernel_name(fp8.kernel) : "";
  }
  return r;
}

SelfCheckReport device_self_check(int ordinal, Kernel kernel, SelfCheckMode mode, uint64_t watchdog_budget_ns,
                                  std::string* error) {
  if (kernel != Kernel::kSm90 && kernel != Kernel::kSm100) {
    *error = "jax_mla: the self-check compares the sm90 or sm100 kernel with the portable one";
    return {};
  }
  const DeviceKernelInfo info = device_kernel_info(ordinal);  // sets the device and initializes it
  if (!info.error.empty()) {
    *error = info.error;
    return {};
  }
  std::lock_guard<std::mutex> lock(g_devices_mutex);  // no initialization of another device meanwhile
  const KernelSelection sel = select_on(g_devices[ordinal].state, static_cast<int32_t>(kernel));
  if (!sel.error.empty()) {
    *error = "jax_mla: " + sel.error;
    return {};
  }
  return run_self_check(kernel, mode, watchdog_budget_ns);
}

}  // namespace jax_mla
