// Which decode kernel runs on a CUDA device: a pure function of the device's compute capability,
// the request (the `kernel` attribute, then JAX_MLA_KERNEL), the settings (runtime/settings.h),
// what this build contains and the outcome of the self-check. Plain C++ (no CUDA), so the
// extension module exposes it to the CPU tests (jax_mla._ext.testing.select_kernel) exactly as the
// CUDA handler uses it.
//
// Precedence: the kernel argument when it is not "auto", else JAX_MLA_KERNEL when set (and not
// "auto"), else the automatic choice:
//   9.0        -> sm90 (with JAX_MLA_SELFCHECK=force|fault|hang only after it passed the self-check)
//   10.0, 10.3 -> sm100, only after it passed the self-check against the portable kernel; a
//                 failed self-check falls back to portable (the handler warns once on stderr)
//   >= 8.0     -> portable (also 9.0 / 10.x when this build lacks their kernel)
//   < 8.0      -> an error: no kernel.
// An explicit request for a kernel the device or the build cannot run is an error, never a
// silent fallback. Explicit requests skip the self-check.
#pragma once

#include <cstdint>
#include <string>

namespace jax_mla {

struct Settings;  // runtime/settings.h

// Values of jax_mla_decode's int32 attribute "kernel" (the extension exports them as _ext.KERNELS,
// which jax_mla/_validate.py uses).
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

// The message for an attribute value outside the enum (the handlers prefix the target name).
inline std::string kernel_attr_error(int32_t value) {
  return std::string("kernel must be one of ") + kKernelChoices + " (attribute values 0 to " +
         std::to_string(kNumKernels - 1) + "), got " + std::to_string(value);
}

// Which kernels read the FP8 cache (KvFormat::kFp8, common/config.h), indexed by Kernel (kAuto's
// entry is unused). The extension exports the names of those that do as _ext.FP8_KERNELS, from which
// jax_mla/_validate.py refuses at trace time what select_kernel refuses here. A kernel that does not
// read the format must never see such a cache: it would take the 656-byte rows for 576 16-bit values.
// The portable kernel's FP8 instantiations (portable/instantiations/*_fp8.cu), the SM90 kernel's
// (sm90/instantiations/*_fp8.cu, sm90/fp8_tiles.cuh) and the SM100 kernel's (sm100/instantiations/
// *_fp8.cu, sm100/fp8_tiles.cuh) read it. Auto takes SM90 on 9.0 and, on 10.x, SM100 for either
// format only after it passed its self-check, which for a candidate that reads the FP8 cache runs
// every case over that cache too (runtime/self_check_cases.h kv_formats); after a failed check,
// portable for both. Portable elsewhere. The SM100 kernel never ran on hardware: that check is its
// only gate, for the FP8 cache as for the 16-bit one.
inline constexpr bool kReadsFp8Cache[kNumKernels] = {false, /*sm90*/ true, /*sm100*/ true, /*portable*/ true};
inline bool reads_fp8_cache(Kernel k) { return kReadsFp8Cache[static_cast<int32_t>(k)]; }

// "kernels that read it: 'portable'" (or that none does yet), for the FP8 refusals.
inline std::string fp8_kernels_phrase() {
  std::string names;
  for (int32_t i = 1; i < kNumKernels; ++i) {
    if (!kReadsFp8Cache[i]) continue;
    names += std::string(names.empty() ? "'" : ", '") + kKernelNames[i] + "'";
  }
  return names.empty() ? std::string("no CUDA kernel reads it yet (the CPU does)")
                       : "kernels that read it: " + names;
}

// Decode kernels compiled into this build. The portable kernel always is.
struct BuiltKernels {
  bool sm90 = false;   // sm_90a cubin of the SM90 kernel (runs on 9.0 only)
  bool sm100 = false;  // sm_100a cubin of the SM100 kernel (10.0 only)
  bool sm103 = false;  // sm_103a cubin of the SM100 kernel (10.3 only)
};

// The decode kernels compiled into this build (JAX_MLA_HAVE_* from the build system); defined in
// runtime/decode_launch.cu (CUDA builds only).
BuiltKernels built_kernels();

// JAX_MLA_SELFCHECK (runtime/settings.h): kDefault (self-check only what auto needs it for, i.e.
// sm100), kForce (also the SM90 kernel on 9.0), kFault (as force, with the candidate's result
// corrupted before the comparison), kHang (as force, with one barrier arrival of the candidate
// withheld, so its watchdog ends it: runtime/self_check.h).
enum class SelfCheckMode : int { kDefault = 0, kForce = 1, kFault = 2, kHang = 3 };

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

// kernel_attr: the attribute (0..3); settings: JAX_MLA_KERNEL (consulted, and its error reported,
// only when kernel_attr is auto) and JAX_MLA_SELFCHECK; check: the outcome of the self-check of
// auto_candidate(...) on this device; fp8_cache: the call's kv_cache holds FP8 rows. Then an
// explicit request (argument or JAX_MLA_KERNEL) for a kernel that does not read them is an error,
// and auto takes its candidate only if that reads them, else the portable kernel when it does
// (no self-check needed), else it is an error. Defined in kernel_select.cc.
KernelSelection select_kernel(int cc_major, int cc_minor, int32_t kernel_attr, const Settings& settings,
                              BuiltKernels built, SelfCheckOutcome check, bool fp8_cache = false);

// Which kernels gather the sparse decode's one-token pages of an FP8 cache with a producer warp
// (runtime/sparse_launch.h; common/fp8_tile.cuh gather_fp8_tile): SM90 and SM100. The portable
// kernel reads any page size through its own loads.
inline constexpr bool kGathersFp8Pages[kNumKernels] = {false, /*sm90*/ true, /*sm100*/ true, /*portable*/ false};

// The kernel of a sparse decode, given `dense`, what select_kernel(..., kAuto, ..., fp8_cache)
// chose for a dense decode of the cache's format on the device (ok()): for an FP8 cache that kernel
// where it gathers (so JAX_MLA_KERNEL and the self-check rule it as for mla_decode), else portable;
// for a 16-bit cache always portable (an SM90 gather of 16-bit boxes measured 2-4% slower than it
// on an H100: docs/performance.md).
inline Kernel sparse_kernel(Kernel dense, bool fp8_cache) {
  return fp8_cache && kGathersFp8Pages[static_cast<int32_t>(dense)] ? dense : Kernel::kPortable;
}

}  // namespace jax_mla
