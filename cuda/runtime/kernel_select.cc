// See kernel_select.h.
#include "runtime/kernel_select.h"

#include "runtime/settings.h"

namespace jax_mla {

KernelSelection select_kernel(int cc_major, int cc_minor, int32_t kernel_attr, const Settings& settings,
                              BuiltKernels built, SelfCheckOutcome check, bool fp8_cache) {
  KernelSelection s;
  Kernel requested;
  if (!kernel_from_attr(kernel_attr, &requested)) {
    s.error = kernel_attr_error(kernel_attr);
    return s;
  }
  const char* source = "the kernel argument";
  if (requested == Kernel::kAuto && settings.kernel.set()) {
    if (!settings.kernel.ok()) {
      s.error = settings.kernel.error;
      return s;
    }
    requested = settings.kernel.value;
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
  if (fp8_cache && requested != Kernel::kAuto && !reads_fp8_cache(requested)) {
    s.error = asked() + " does not read the FP8 kv_cache (uint8 rows of 656 bytes); " + fp8_kernels_phrase();
    return s;
  }
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
  const AutoCandidate candidate = auto_candidate(cc_major, cc_minor, built, settings.self_check.value);
  if (fp8_cache && !reads_fp8_cache(candidate.kernel)) {
    // The device's own kernel does not read FP8 rows: the portable one, which needs no self-check.
    if (reads_fp8_cache(Kernel::kPortable)) {
      s.kernel = Kernel::kPortable;
    } else {
      s.error = std::string("kernel 'auto' has no kernel for the FP8 kv_cache (uint8 rows of 656 bytes) on ") +
                "compute capability " + cc() + ": " + fp8_kernels_phrase();
    }
    return s;
  }
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
