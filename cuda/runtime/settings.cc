// See settings.h.
#include "runtime/settings.h"

#include <cstdlib>
#include <cstring>

namespace jax_mla {
namespace {

// "'a'", "'a' or 'b'", "one of 'a', 'b', 'c'".
std::string accepted(const char* const* choices, int n) {
  std::string s = n > 2 ? "one of " : "";
  for (int i = 0; i < n; ++i) {
    if (i > 0) s += n > 2 ? ", " : " or ";
    s += std::string("'") + choices[i] + "'";
  }
  return s;
}

// Sets out->value to values[i] for the choice named by text ("" or null: unset, the default).
template <typename T>
void parse_choice(const char* name, const char* text, const char* const* choices, const T* values, int n,
                  Setting<T>* out) {
  out->text = text ? text : "";
  if (out->text.empty()) return;  // unset: the default value-initialised T
  for (int i = 0; i < n; ++i) {
    if (out->text == choices[i]) {
      out->value = values[i];
      return;
    }
  }
  out->error = std::string(name) + " must be " + accepted(choices, n) + " (or unset), got '" + out->text + "'";
}

}  // namespace

Settings parse_settings(const char* kernel, const char* self_check, const char* cpu_isa) {
  Settings s;
  constexpr Kernel kKernels[kNumKernels] = {Kernel::kAuto, Kernel::kSm90, Kernel::kSm100, Kernel::kPortable};
  parse_choice(kSettingNames[0], kernel, kKernelNames, kKernels, kNumKernels, &s.kernel);
  constexpr const char* kModes[] = {"force", "fault", "hang"};
  constexpr SelfCheckMode kModeValues[] = {SelfCheckMode::kForce, SelfCheckMode::kFault, SelfCheckMode::kHang};
  parse_choice(kSettingNames[1], self_check, kModes, kModeValues, 3, &s.self_check);
  constexpr const char* kIsas[] = {"generic"};
  constexpr CpuIsa kIsaValues[] = {CpuIsa::kGeneric};
  parse_choice(kSettingNames[2], cpu_isa, kIsas, kIsaValues, 1, &s.cpu_isa);
  return s;
}

const Settings& settings() {
  static const Settings s =
      parse_settings(std::getenv(kSettingNames[0]), std::getenv(kSettingNames[1]), std::getenv(kSettingNames[2]));
  return s;
}

}  // namespace jax_mla
