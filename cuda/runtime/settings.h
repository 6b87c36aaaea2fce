// The runtime settings of jax_mla: every knob that changes what the handlers do without changing
// a call's arguments. They are environment variables, the only way to set them; this module is the
// only code that reads them (the CPU kernel's JAX_MLA_CPU_ISA choice aside, see below), once per
// process, at the first use. Set them before the first jax_mla call of the process:
//
//   JAX_MLA_KERNEL     'auto' (the default when unset or empty), 'sm90', 'sm100' or 'portable'.
//                      The CUDA kernel that kernel="auto" runs; an explicit `kernel` argument wins
//                      (runtime/kernel_select.h).
//   JAX_MLA_SELFCHECK  unset or empty (self-check only what "auto" needs it for: sm100 on 10.x),
//                      'force' (also the sm90 kernel on 9.0, so the self-check can be exercised on
//                      H100 / H200), 'fault' (as force, and the candidate's result is corrupted
//                      before the comparison, to exercise the fallback) or 'hang' (as force, and the
//                      candidate withholds one barrier arrival, to exercise its watchdog). CUDA only.
//   JAX_MLA_CPU_ISA    unset or empty (AVX2 + FMA block products where the CPU has them) or
//                      'generic' (the baseline ones, to test them on any machine). CPU only. The
//                      CPU kernel reads the value itself (cpu/block_gemm_generic.cc); the CPU
//                      handler refuses a value this module does not accept.
//
// A bad value is an error naming the variable, its accepted values and what it got. It is reported
// by the calls that consult the setting: JAX_MLA_KERNEL by CUDA decodes with kernel="auto" (and
// kernel_info), JAX_MLA_SELFCHECK by every CUDA initialization, JAX_MLA_CPU_ISA by every CPU decode.
// Plain C++ (no CUDA), so the CPU-only build and the tests share it.
#pragma once

#include <string>

#include "runtime/kernel_select.h"

namespace jax_mla {

// JAX_MLA_CPU_ISA.
enum class CpuIsa : int { kAuto = 0, kGeneric = 1 };

// One parsed setting: `value` is meaningful when ok(); `text` is the variable as read ("" when
// unset); `error` the message for a value outside the accepted ones.
template <typename T>
struct Setting {
  std::string text;
  T value{};
  std::string error;
  bool ok() const { return error.empty(); }
  bool set() const { return !text.empty(); }
};

struct Settings {
  Setting<Kernel> kernel;             // JAX_MLA_KERNEL (kAuto when unset)
  Setting<SelfCheckMode> self_check;  // JAX_MLA_SELFCHECK (kDefault when unset)
  Setting<CpuIsa> cpu_isa;            // JAX_MLA_CPU_ISA (kAuto when unset)
};

// The variables' names, in the order of Settings' fields.
inline constexpr const char* kSettingNames[3] = {"JAX_MLA_KERNEL", "JAX_MLA_SELFCHECK", "JAX_MLA_CPU_ISA"};

// Parses the three values (null or "" for unset) without reading the environment: what settings()
// does with the environment's values, and what the tests call with theirs.
Settings parse_settings(const char* kernel, const char* self_check, const char* cpu_isa);

// The settings of this process: the environment as read at the first call, never re-read.
const Settings& settings();

}  // namespace jax_mla
