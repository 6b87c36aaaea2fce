// jax_mla._ext.testing: hooks for tests and benchmarks, not used by the jax_mla package. The host
// schedule planner, the schedule size, the kernel selection as a pure function, the settings
// parser, the CUDA handler's call counters, and a run of the self-check on demand.
#include "python/testing.h"

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "common/scheduler.h"
#include "runtime/call_stats.h"
#include "runtime/kernel_select.h"
#include "runtime/self_check.h"
#include "runtime/settings.h"
#ifdef JAX_MLA_WITH_CUDA
#include "runtime/device.h"
#endif

namespace nb = nanobind;

namespace jax_mla {
namespace python {
namespace {

void check_sizes(int64_t batch, int64_t num_parts) {
  if (batch < 0) throw nb::value_error("batch must be >= 0");
  if (num_parts < 1) throw nb::value_error("num_parts must be >= 1");
}

using SeqLens = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;  // (b,)
using Schedule = nb::ndarray<nb::numpy, int32_t, nb::ndim<1>>;                          // (schedule_size,)

// Host reference planner (scheduler.h): the exact array jax_mla_decode_schedule produces.
// chunk_blocks > 0: the batch-invariant plan with that chunk and max_chunks chunks at most per
// request (0: num_parts, what decode_schedule uses).
Schedule plan_schedule(SeqLens seq_lens, int num_parts, int chunk_blocks, int max_chunks) {
  const int64_t batch = static_cast<int64_t>(seq_lens.shape(0));
  check_sizes(batch, num_parts);
  if (batch > INT32_MAX) throw nb::value_error("batch must fit in int32");
  if (chunk_blocks < 0 || chunk_blocks > kMaxInvariantChunkBlocks) throw nb::value_error("chunk_blocks out of range");
  if (max_chunks < 0) throw nb::value_error("max_chunks must be >= 0");
  const ChunkSpec chunks = chunk_blocks > 0 ? ChunkSpec{chunk_blocks, max_chunks > 0 ? max_chunks : num_parts}
                                            : ChunkSpec{0, 0};
  const size_t size = static_cast<size_t>(schedule_size(batch, num_parts, chunks.invariant()));
  int32_t* schedule = new int32_t[size];  // (schedule_size(b, num_parts, .)), owned by the numpy array
  nb::capsule owner(schedule, [](void* p) noexcept { delete[] static_cast<int32_t*>(p); });
  std::vector<int64_t> cost_prefix(static_cast<size_t>(batch) + 1);  // (b + 1)
  plan_schedule_host(seq_lens.data(), static_cast<int>(batch), num_parts, cost_prefix.data(), schedule, chunks);
  return Schedule(schedule, {size}, owner);
}

BuiltKernels parse_built(const std::vector<std::string>& names) {
  BuiltKernels b;
  for (const std::string& n : names) {
    if (n == "sm90") b.sm90 = true;
    else if (n == "sm100") b.sm100 = true;
    else if (n == "sm103") b.sm103 = true;
    else throw nb::value_error(("built: unknown kernel '" + n + "' (expected sm90, sm100, sm103)").c_str());
  }
  return b;
}

// Settings from the given JAX_MLA_KERNEL / JAX_MLA_SELFCHECK values; an invalid self-check mode
// raises at once, as it fails the CUDA initialization.
Settings settings_for(const std::optional<std::string>& env_kernel, const std::string& self_check_mode) {
  Settings s = parse_settings(env_kernel ? env_kernel->c_str() : nullptr, self_check_mode.c_str(), nullptr);
  if (!s.self_check.ok()) throw nb::value_error(s.self_check.error.c_str());
  return s;
}

nb::dict select(int cc_major, int cc_minor, int32_t kernel, std::optional<std::string> env,
                const std::string& self_check, const std::vector<std::string>& built,
                const std::string& self_check_mode, bool fp8_cache, bool sparse) {
  SelfCheckOutcome outcome;
  if (self_check == "not run") outcome = SelfCheckOutcome::kNotRun;
  else if (self_check == "passed") outcome = SelfCheckOutcome::kPassed;
  else if (self_check == "failed") outcome = SelfCheckOutcome::kFailed;
  else throw nb::value_error("self_check must be 'not run', 'passed' or 'failed'");
  const KernelSelection sel =
      select_kernel(cc_major, cc_minor, kernel, settings_for(env, self_check_mode), parse_built(built), outcome,
                    fp8_cache);
  if (!sel.error.empty()) throw nb::value_error(sel.error.c_str());
  nb::dict d;
  const Kernel k = sparse ? sparse_kernel(sel.kernel, fp8_cache) : sel.kernel;
  d["kernel"] = sel.needs_self_check ? nb::none() : nb::object(nb::str(kernel_name(k)));
  d["fell_back"] = sel.fell_back;
  d["needs_self_check"] = sel.needs_self_check;
  return d;
}

nb::tuple candidate(int cc_major, int cc_minor, const std::vector<std::string>& built,
                    const std::string& self_check_mode) {
  const AutoCandidate c = auto_candidate(cc_major, cc_minor, parse_built(built),
                                         settings_for(std::nullopt, self_check_mode).self_check.value);
  return nb::make_tuple(kernel_name(c.kernel), c.needs_self_check);
}

// {variable: (text, error)} of parse_settings for the given values (None: unset).
nb::dict parse(std::optional<std::string> kernel, std::optional<std::string> self_check,
               std::optional<std::string> cpu_isa) {
  const auto c = [](const std::optional<std::string>& v) { return v ? v->c_str() : nullptr; };
  const Settings s = parse_settings(c(kernel), c(self_check), c(cpu_isa));
  nb::dict d;
  d[kSettingNames[0]] = nb::make_tuple(s.kernel.text, s.kernel.error);
  d[kSettingNames[1]] = nb::make_tuple(s.self_check.text, s.self_check.error);
  d[kSettingNames[2]] = nb::make_tuple(s.cpu_isa.text, s.cpu_isa.error);
  return d;
}

nb::dict cuda_call_stats() {
  const CallStats st = call_stats();
  nb::dict d;
  d["decode_calls"] = st.decode_calls;
  d["decode_captured"] = st.decode_captured;
  d["sm90_fused_merge_launches"] = st.sm90_fused_merge_launches;
  return d;
}

// The self-check of `kernel` on a device, now (runtime/device.h device_self_check).
nb::dict run_self_check(int ordinal, const std::string& kernel, const std::string& mode, double watchdog_ms) {
  Kernel k = Kernel::kAuto;
  if (kernel == "sm90") k = Kernel::kSm90;
  else if (kernel == "sm100") k = Kernel::kSm100;
  else throw nb::value_error("kernel must be 'sm90' or 'sm100'");
  SelfCheckMode m;
  if (mode == "force") m = SelfCheckMode::kForce;
  else if (mode == "fault") m = SelfCheckMode::kFault;
  else if (mode == "hang") m = SelfCheckMode::kHang;
  else throw nb::value_error("mode must be 'force', 'fault' or 'hang'");
  if (!(watchdog_ms > 0 && watchdog_ms <= 60000)) throw nb::value_error("watchdog_ms must be in (0, 60000]");
#ifdef JAX_MLA_WITH_CUDA
  std::string error;
  const SelfCheckReport r = device_self_check(ordinal, k, m, static_cast<uint64_t>(watchdog_ms * 1e6), &error);
  if (!error.empty()) throw std::runtime_error(error);
  nb::dict d;
  d["passed"] = r.passed;
  d["detail"] = r.detail;
  d["watchdog_expired"] = r.watchdog_expired;
  d["cases"] = r.cases;
  d["seconds"] = r.seconds;
  d["device_ms"] = r.device_ms;
  return d;
#else
  (void)ordinal;
  (void)k;
  (void)m;
  throw std::runtime_error("jax_mla: this build has no CUDA kernels");
#endif
}

}  // namespace

void define_testing(nb::module_ m) {
  m.def(
      "schedule_size",
      [](int64_t batch, int64_t num_parts, bool invariant) {
        check_sizes(batch, num_parts);
        return schedule_size(batch, num_parts, invariant);
      },
      nb::arg("batch"), nb::arg("num_parts"), nb::arg("invariant") = false,
      "int32 elements of a split-KV schedule (common/scheduler.h; invariant: a batch-invariant plan's).");
  m.def("plan_schedule", &plan_schedule, nb::arg("seq_lens"), nb::arg("num_parts"), nb::arg("chunk_blocks") = 0,
        nb::arg("max_chunks") = 0,
        "Split-KV schedule of int32 seq_lens (b,) for num_parts parts, planned on the host (the line or "
        "pieces plan, as cuda/common/scheduler.h chooses; with chunk_blocks > 0 the batch-invariant plan "
        "of that chunk and at most max_chunks chunks per request, 0: num_parts).");
  m.def("select_kernel", &select, nb::arg("cc_major"), nb::arg("cc_minor"), nb::arg("kernel"),
        nb::arg("env") = nb::none(), nb::arg("self_check") = "not run",
        nb::arg("built") = std::vector<std::string>{"sm90"}, nb::arg("self_check_mode") = "",
        nb::arg("fp8_cache") = false, nb::arg("sparse") = false,
        "The decode kernel the CUDA handler picks (runtime/kernel_select.h) with JAX_MLA_KERNEL = env and "
        "JAX_MLA_SELFCHECK = self_check_mode, for a kv_cache of FP8 rows when fp8_cache, for "
        "mla_decode_sparse when sparse (kernel must then be 0, auto): {'kernel', 'fell_back', "
        "'needs_self_check'}; ValueError with the handler's message when it refuses the call.");
  m.def("auto_candidate", &candidate, nb::arg("cc_major"), nb::arg("cc_minor"),
        nb::arg("built") = std::vector<std::string>{"sm90"}, nb::arg("self_check_mode") = "",
        "(kernel, needs_self_check): what kernel='auto' prefers on a device before any self-check.");
  m.def("parse_settings", &parse, nb::arg("kernel") = nb::none(), nb::arg("self_check") = nb::none(),
        nb::arg("cpu_isa") = nb::none(),
        "{variable: (text, error)}: the settings (runtime/settings.h) these values give; error '' when valid.");
  m.def("run_self_check", &run_self_check, nb::arg("device_ordinal"), nb::arg("kernel"), nb::arg("mode") = "force",
        nb::arg("watchdog_ms") = static_cast<double>(kSelfCheckWatchdogNs) / 1e6,
        "Runs the self-check of kernel ('sm90' or 'sm100') against the portable kernel on a CUDA device now, "
        "with mode 'force' (as it is), 'fault' (one output element corrupted) or 'hang' (one barrier arrival "
        "withheld: the candidate's watchdog must end it) and a watchdog budget per candidate launch: {'passed', "
        "'detail', 'watchdog_expired', 'cases', 'seconds', 'device_ms'}. The device's kernel selection is "
        "unchanged. RuntimeError without CUDA or when the device cannot run the kernel.");
  m.def("cuda_call_stats", &cuda_call_stats,
        "{'decode_calls', 'decode_captured', 'sm90_fused_merge_launches'}: runs of the CUDA decode handler in "
        "this process, how many of them traced into a CUDA graph (XLA command buffers; graph replays do not "
        "run the handler), and how many merged their splits in the SM90 kernel. Zeros without CUDA.");
}

}  // namespace python
}  // namespace jax_mla
