// Which decode kernel runs on a CUDA device: a pure function of the device's compute capability,
// the request (the `kernel` attribute, then JAX_MLA_KERNEL), what this build contains and the
// outcome of the self-check. Plain C++ (no CUDA), so the extension module exposes it to the CPU
// tests (jax_mla._ext.select_kernel) exactly as the CUDA handler uses it.
//
// Precedence: the kernel argument when it is not "auto", else JAX_MLA_KERNEL when set (and not
// "auto"), else the automatic choice:
//   9.0        -> sm90 (with JAX_MLA_SELFCHECK=force|fault only after it passed the self-check)
//   10.0, 10.3 -> sm100, only after it passed the self-check against the portable kernel; a
//                 failed self-check falls back to portable (the handler warns once on stderr)
//   >= 8.0     -> portable (also 9.0 / 10.x when this build lacks their kernel)
//   < 8.0      -> an error: no kernel.
// An explicit request for a kernel the device or the build cannot run is an error, never a
// silent fallback. Explicit requests skip the self-check.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

namespace jax_mla {

// Values of jax_mla_decode's int32 attribute "kernel" (jax_mla/_validate.py KERNELS mirrors them).
enum class Kernel : int32_t { kAuto = 0, kSm90 = 1, kSm100 = 2, kPortable = 3 };
inline constexpr int32_t kNumKernels = 4;
inline constexpr const char* kKernelNames[kNumKernels] = {"auto", "sm90", "sm100", "portable"};
inline constexpr const char* kKernelChoices = "'auto', 'sm90', 'sm100', 'portable'";

inline const char* kernel_name(Kernel k) { return kKernelNames[static_cast<int32_t>(k)]; }

inline bool kernel_from_attr(int32_t value, Kernel* k) {
  if (value < 0 || value >= kNumKernels) return false;
  *k = static_cast<Kernel>(value);
  return true;
}

inline bool kernel_from_name(const char* name, Kernel* k) {
  for (int32_t i = 0; i < kNumKernels; ++i) {
    if (std::strcmp(name, kKernelNames[i]) == 0) {
      *k = static_cast<Kernel>(i);
      return true;
    }
  }
  return false;
}

// The message for an attribute value outside the enum (the handlers prefix the target name).
inline std::string kernel_attr_error(int32_t value) {
  return std::string("kernel must be one of ") + kKernelChoices + " (attribute values 0 to " +
         std::to_string(kNumKernels - 1) + "), got " + std::to_string(value);
}

// Decode kernels compiled into this build. The portable kernel always is.
struct BuiltKernels {
  bool sm90 = false;   // sm_90a cubin of the SM90 kernel (runs on 9.0 only)
  bool sm100 = false;  // sm_100a cubin of the SM100 kernel (10.0 only)
  bool sm103 = false;  // sm_103a cubin of the SM100 kernel (10.3 only)
};

// JAX_MLA_SELFCHECK: unset or "" (default: self-check only what auto needs it for, i.e. sm100),
// "force" (also the SM90 kernel on 9.0, so the self-check can be exercised on H100/H200), "fault"
// (as force, and the candidate's result is corrupted before the comparison, to test the fallback).
enum class SelfCheckMode : int { kDefault = 0, kForce = 1, kFault = 2 };

inline bool self_check_mode_from_env(const char* value, SelfCheckMode* mode) {
  if (value == nullptr || *value == '\0') {
    *mode = SelfCheckMode::kDefault;
  } else if (std::strcmp(value, "force") == 0) {
    *mode = SelfCheckMode::kForce;
  } else if (std::strcmp(value, "fault") == 0) {
    *mode = SelfCheckMode::kFault;
  } else {
    return false;
  }
  return true;
}

inline std::string self_check_env_error(const char* value) {
  return std::string("JAX_MLA_SELFCHECK must be 'force' or 'fault' (or unset), got '") + value + "'";
}

enum class SelfCheckOutcome : int { kNotRun = 0, kPassed = 1, kFailed = 2 };
inline constexpr const char* kSelfCheckNames[3] = {"not run", "passed", "failed"};

// The kernel "auto" prefers on a device, and whether it may take it only after a passing
// self-check against the portable kernel (which the initialize stage then runs, once per device).
struct AutoCandidate {
  Kernel kernel;
  bool needs_self_check;
};

inline AutoCandidate auto_candidate(int cc_major, int cc_minor, BuiltKernels built, SelfCheckMode mode) {
  if (cc_major == 9 && cc_minor == 0 && built.sm90) return {Kernel::kSm90, mode != SelfCheckMode::kDefault};
  if (cc_major == 10 && ((cc_minor == 0 && built.sm100) || (cc_minor == 3 && built.sm103))) {
    return {Kernel::kSm100, true};
  }
  return {Kernel::kPortable, false};
}

struct KernelSelection {
  Kernel kernel = Kernel::kPortable;  // what to launch when ok(): kSm90, kSm100 or kPortable
  bool fell_back = false;             // auto took portable because its candidate failed the self-check
  bool needs_self_check = false;      // auto's candidate must pass a self-check that has not run yet
  std::string error;                  // non-empty: refuse the call with this message
  bool ok() const { return error.empty() && !needs_self_check; }
};

inline std::string compute_capability_string(int cc_major, int cc_minor) {
  return std::to_string(cc_major) + "." + std::to_string(cc_minor);
}

// kernel_attr: the attribute (0..3); env_kernel: JAX_MLA_KERNEL (null or "" when unset);
// check: the outcome of the self-check of auto_candidate(...) on this device.
inline KernelSelection select_kernel(int cc_major, int cc_minor, int32_t kernel_attr, const char* env_kernel,
                                     BuiltKernels built, SelfCheckMode mode, SelfCheckOutcome check) {
  KernelSelection s;
  Kernel requested;
  if (!kernel_from_attr(kernel_attr, &requested)) {
    s.error = kernel_attr_error(kernel_attr);
    return s;
  }
  const char* source = "the kernel argument";
  if (requested == Kernel::kAuto && env_kernel != nullptr && *env_kernel != '\0') {
    if (!kernel_from_name(env_kernel, &requested)) {
      s.error = std::string("JAX_MLA_KERNEL must be one of ") + kKernelChoices + " (or unset), got '" + env_kernel + "'";
      return s;
    }
    source = "JAX_MLA_KERNEL";
  }
  // Messages are built only on the error paths: the execute stage calls this for every launch.
  const auto cc = [&] { return compute_capability_string(cc_major, cc_minor); };
  if (cc_major < 8) {
    s.error = "no CUDA kernel for compute capability " + cc() + ": jax_mla's GPU kernels need 8.0 or newer";
    return s;
  }
  const auto asked = [&] {
    return std::string("kernel '") + kernel_name(requested) + "' (requested by " + source + ")";
  };
  switch (requested) {
    case Kernel::kSm90:
      if (!(cc_major == 9 && cc_minor == 0)) {
        s.error = asked() + " needs compute capability 9.0 (H100, H200); this device has " + cc();
      } else if (!built.sm90) {
        s.error = asked() + " is not in this build (compiled without sm_90a)";
      } else {
        s.kernel = Kernel::kSm90;
      }
      return s;
    case Kernel::kSm100:
      if (!(cc_major == 10 && (cc_minor == 0 || cc_minor == 3))) {
        s.error = asked() + " needs compute capability 10.0 or 10.3 (B200, B300); this device has " + cc();
      } else if (!(cc_minor == 0 ? built.sm100 : built.sm103)) {
        s.error = asked() + " is not in this build for compute capability " + cc() + " (no sm_10" +
                  std::to_string(cc_minor) + "a SM100 kernel compiled in)";
      } else {
        s.kernel = Kernel::kSm100;
      }
      return s;
    case Kernel::kPortable:
      s.kernel = Kernel::kPortable;
      return s;
    case Kernel::kAuto:
      break;
  }
  const AutoCandidate candidate = auto_candidate(cc_major, cc_minor, built, mode);
  if (!candidate.needs_self_check) {
    s.kernel = candidate.kernel;
  } else if (check == SelfCheckOutcome::kNotRun) {
    s.needs_self_check = true;
  } else if (check == SelfCheckOutcome::kPassed) {
    s.kernel = candidate.kernel;
  } else {
    s.kernel = Kernel::kPortable;
    s.fell_back = true;
  }
  return s;
}

}  // namespace jax_mla
