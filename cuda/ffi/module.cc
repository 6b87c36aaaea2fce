// The extension module jax_mla._ext: XLA FFI handler capsules for jax.ffi.register_ffi_target,
// plus the few native helpers the Python package needs (schedule / workspace sizes, the host
// schedule planner, CUDA device info). See docs/design.md ("FFI targets").
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "common/config.h"
#include "common/scheduler.h"
#include "common/workspace.h"
#include "ffi/handlers.h"
#include "ffi/kernel_select.h"
#ifdef JAX_MLA_WITH_CUDA
#include "ffi/device_query.h"
#include "ffi/kernel_info.h"
#endif

namespace nb = nanobind;

namespace {

// jax.ffi.register_ffi_target takes the handler as a PyCapsule holding the function pointer.
nb::capsule handler_capsule(XLA_FFI_Handler* handler) { return nb::capsule(reinterpret_cast<void*>(handler)); }

// {platform: {target: handler}}, where handler is a capsule (single-stage handler) or a dict
// {stage: capsule} with stage in "instantiate", "prepare", "initialize", "execute" (the form
// XLA's register_custom_call_target accepts for api_version=1, on CPU and in the CUDA plugin).
nb::dict registrations() {
  nb::dict cpu;
  cpu["jax_mla_decode"] = handler_capsule(MlaDecodeCpu);
  cpu["jax_mla_decode_schedule"] = handler_capsule(MlaDecodeScheduleCpu);
  nb::dict platforms;
  platforms["cpu"] = cpu;
#ifdef JAX_MLA_WITH_CUDA
  nb::dict decode_stages;
  decode_stages["initialize"] = handler_capsule(MlaDecodeCudaInitialize);
  decode_stages["execute"] = handler_capsule(MlaDecodeCudaExecute);
  nb::dict cuda;
  cuda["jax_mla_decode"] = decode_stages;
  // Both targets share the initialize stage: it caches device properties and raises the kernels'
  // shared-memory limits once per device, so the execute stages only launch work.
  nb::dict schedule_stages;
  schedule_stages["initialize"] = handler_capsule(MlaDecodeCudaInitialize);
  schedule_stages["execute"] = handler_capsule(MlaDecodeScheduleCudaExecute);
  cuda["jax_mla_decode_schedule"] = schedule_stages;
  platforms["CUDA"] = cuda;
#endif
  return platforms;
}

bool has_cuda() {
#ifdef JAX_MLA_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_sm_count() {
#ifdef JAX_MLA_WITH_CUDA
  return jax_mla::cuda_sm_count();
#else
  return 0;
#endif
}

nb::dict cuda_call_stats() {
  nb::dict d;
#ifdef JAX_MLA_WITH_CUDA
  const jax_mla::CudaCallStats st = jax_mla::cuda_call_stats();
  d["decode_calls"] = st.decode_calls;
  d["decode_captured"] = st.decode_captured;
  d["sm90_fused_merge_launches"] = st.sm90_fused_merge_launches;
#else
  d["decode_calls"] = 0;
  d["decode_captured"] = 0;
#endif
  return d;
}

void check_sizes(int64_t batch, int64_t num_parts) {
  if (batch < 0) throw nb::value_error("batch must be >= 0");
  if (num_parts < 1) throw nb::value_error("num_parts must be >= 1");
}

using SeqLens = nb::ndarray<const int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;  // (b,)
using Schedule = nb::ndarray<nb::numpy, int32_t, nb::ndim<1>>;                          // (schedule_size,)

// Host reference planner (scheduler.h): the exact array jax_mla_decode_schedule produces.
Schedule plan_schedule(SeqLens seq_lens, int num_parts) {
  const int64_t batch = static_cast<int64_t>(seq_lens.shape(0));
  check_sizes(batch, num_parts);
  if (batch > INT32_MAX) throw nb::value_error("batch must fit in int32");
  const size_t size = static_cast<size_t>(jax_mla::schedule_size(batch, num_parts));
  int32_t* schedule = new int32_t[size];  // (schedule_size(b, num_parts)), owned by the numpy array
  nb::capsule owner(schedule, [](void* p) noexcept { delete[] static_cast<int32_t*>(p); });
  std::vector<int64_t> cost_prefix(static_cast<size_t>(batch) + 1);  // (b + 1)
  jax_mla::plan_schedule_host(seq_lens.data(), static_cast<int>(batch), num_parts, cost_prefix.data(), schedule);
  return Schedule(schedule, {size}, owner);
}

// ---- kernel selection (ffi/kernel_select.h) ----------------------------------------------------

jax_mla::BuiltKernels parse_built(const std::vector<std::string>& names) {
  jax_mla::BuiltKernels b;
  for (const std::string& n : names) {
    if (n == "sm90") b.sm90 = true;
    else if (n == "sm100") b.sm100 = true;
    else if (n == "sm103") b.sm103 = true;
    else throw nb::value_error(("built: unknown kernel '" + n + "' (expected sm90, sm100, sm103)").c_str());
  }
  return b;
}

jax_mla::SelfCheckMode parse_mode(const std::string& mode) {
  jax_mla::SelfCheckMode m;
  if (!jax_mla::self_check_mode_from_env(mode.c_str(), &m)) {
    throw nb::value_error(jax_mla::self_check_env_error(mode.c_str()).c_str());
  }
  return m;
}

nb::dict select_kernel(int cc_major, int cc_minor, int32_t kernel, std::optional<std::string> env,
                       const std::string& self_check, const std::vector<std::string>& built,
                       const std::string& self_check_mode) {
  jax_mla::SelfCheckOutcome outcome;
  if (self_check == "not run") outcome = jax_mla::SelfCheckOutcome::kNotRun;
  else if (self_check == "passed") outcome = jax_mla::SelfCheckOutcome::kPassed;
  else if (self_check == "failed") outcome = jax_mla::SelfCheckOutcome::kFailed;
  else throw nb::value_error("self_check must be 'not run', 'passed' or 'failed'");
  const jax_mla::KernelSelection sel =
      jax_mla::select_kernel(cc_major, cc_minor, kernel, env ? env->c_str() : nullptr, parse_built(built),
                             parse_mode(self_check_mode), outcome);
  if (!sel.error.empty()) throw nb::value_error(sel.error.c_str());
  nb::dict d;
  d["kernel"] = sel.needs_self_check ? nb::none() : nb::object(nb::str(jax_mla::kernel_name(sel.kernel)));
  d["fell_back"] = sel.fell_back;
  d["needs_self_check"] = sel.needs_self_check;
  return d;
}

nb::tuple auto_candidate(int cc_major, int cc_minor, const std::vector<std::string>& built,
                         const std::string& self_check_mode) {
  const jax_mla::AutoCandidate c =
      jax_mla::auto_candidate(cc_major, cc_minor, parse_built(built), parse_mode(self_check_mode));
  return nb::make_tuple(jax_mla::kernel_name(c.kernel), c.needs_self_check);
}

// Names of the GPU decode kernels in this build (empty without CUDA).
std::vector<std::string> built_kernels() {
  std::vector<std::string> names;
#ifdef JAX_MLA_WITH_CUDA
  const jax_mla::BuiltKernels b = jax_mla::built_kernels();
  if (b.sm90) names.push_back("sm90");
  if (b.sm100) names.push_back("sm100");
  if (b.sm103) names.push_back("sm103");
  names.push_back("portable");
#endif
  return names;
}

nb::dict kernel_info(int ordinal) {
#ifdef JAX_MLA_WITH_CUDA
  const jax_mla::DeviceKernelInfo info = jax_mla::device_kernel_info(ordinal);
  if (!info.error.empty()) throw std::runtime_error(info.error);
  nb::dict d;
  d["compute_capability"] = nb::make_tuple(info.cc_major, info.cc_minor);
  d["kernel"] = info.kernel;
  d["fell_back"] = info.fell_back;
  d["self_check"] = info.self_check;
  d["self_check_kernel"] = info.self_check_kernel;
  d["self_check_detail"] = info.self_check_detail;
  d["env_kernel"] = info.env_kernel;
  d["env_self_check"] = info.env_self_check;
  return d;
#else
  (void)ordinal;
  throw std::runtime_error("jax_mla: this build has no CUDA kernels");
#endif
}

}  // namespace

NB_MODULE(_ext, m) {
  m.doc() = "jax-mla native extension: XLA FFI handlers for MLA decode and helpers";

  m.def("registrations", &registrations,
        "{platform: {target: capsule or {stage: capsule}}} for jax.ffi.register_ffi_target.");
  m.def("has_cuda", &has_cuda, "True when the module was built with the CUDA kernels.");
  m.def("cuda_sm_count", &cuda_sm_count, "SM count of CUDA device 0; 0 without a device, a driver or CUDA support.");
  m.def("cuda_call_stats", &cuda_call_stats,
        "{'decode_calls', 'decode_captured'}: runs of the CUDA decode handler in this process, and how many "
        "of them traced into a CUDA graph (XLA command buffers); graph replays do not run the handler.");
  m.def(
      "schedule_size",
      [](int64_t batch, int64_t num_parts) {
        check_sizes(batch, num_parts);
        return jax_mla::schedule_size(batch, num_parts);
      },
      nb::arg("batch"), nb::arg("num_parts"), "int32 elements of a split-KV schedule.");
  m.def(
      "workspace_bytes",
      [](int64_t batch, int64_t rows, int64_t num_parts) {
        check_sizes(batch, num_parts);
        if (rows < 1) throw nb::value_error("rows must be >= 1");
        return jax_mla::workspace_layout(batch, rows, num_parts).total_bytes;
      },
      nb::arg("batch"), nb::arg("rows"), nb::arg("num_parts"),
      "Bytes of the CUDA workspace result of jax_mla_decode (rows = s_q * h_q).");
  m.def("plan_schedule", &plan_schedule, nb::arg("seq_lens"), nb::arg("num_parts"),
        "Split-KV schedule of int32 seq_lens (b,) for num_parts parts, planned on the host (the line or "
        "pieces plan, as cuda/common/scheduler.h chooses).");

  m.def("select_kernel", &select_kernel, nb::arg("cc_major"), nb::arg("cc_minor"), nb::arg("kernel"),
        nb::arg("env") = nb::none(), nb::arg("self_check") = "not run",
        nb::arg("built") = std::vector<std::string>{"sm90"}, nb::arg("self_check_mode") = "",
        "The decode kernel the CUDA handler picks (ffi/kernel_select.h): {'kernel', 'fell_back', "
        "'needs_self_check'}; ValueError with the handler's message when it refuses the call.");
  m.def("auto_candidate", &auto_candidate, nb::arg("cc_major"), nb::arg("cc_minor"),
        nb::arg("built") = std::vector<std::string>{"sm90"}, nb::arg("self_check_mode") = "",
        "(kernel, needs_self_check): what kernel='auto' prefers on a device before any self-check.");
  m.def("built_kernels", &built_kernels, "Names of the GPU decode kernels compiled into this build.");
  m.def("kernel_info", &kernel_info, nb::arg("device_ordinal"),
        "Which kernel a CUDA device uses (initializes it for jax_mla if needed, self-check included).");
  nb::dict kernels;
  for (int32_t i = 0; i < jax_mla::kNumKernels; ++i) kernels[jax_mla::kKernelNames[i]] = i;
  m.attr("KERNELS") = kernels;
  m.attr("HEAD_DIM_QK") = jax_mla::kHeadDimQK;
  m.attr("HEAD_DIM_V") = jax_mla::kHeadDimV;
  m.attr("BLOCK_M") = jax_mla::kBlockM;
  m.attr("BLOCK_N") = jax_mla::kBlockN;
  m.attr("MAX_SEQ_Q") = jax_mla::kMaxSeqQ;
  m.attr("MAX_HEADS_Q") = jax_mla::kMaxHeadsQ;
  m.attr("PART_FIELDS") = static_cast<int>(jax_mla::kPartFields);
  m.attr("COMBINE_HEADER") = static_cast<int>(jax_mla::kCombineHeader);
  m.attr("MANY_SPLITS") = jax_mla::kManySplits;
}
