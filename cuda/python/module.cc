// The extension module jax_mla._ext: what the jax_mla Python package needs from C++. XLA FFI
// handler capsules for jax.ffi.register_ffi_target, the table of limits the Python checks use, the
// workspace size the CUDA lowering allocates, and CUDA device information. See docs/design.md
// ("FFI targets"). Hooks only tests and benchmarks use live in the submodule jax_mla._ext.testing
// (testing.cc), which is not part of the package's API.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "common/workspace.h"
#include "ffi/handlers.h"
#include "python/testing.h"
#include "runtime/kernel_select.h"
#include "runtime/limits.h"
#ifdef JAX_MLA_WITH_CUDA
#include "runtime/device.h"
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
  cpu["jax_mla_decode_sparse"] = handler_capsule(MlaDecodeSparseCpu);
  nb::dict platforms;
  platforms["cpu"] = cpu;
#ifdef JAX_MLA_WITH_CUDA
  // The targets share the initialize stage: it sets the device up once (runtime/device.h), so
  // the execute stages only launch work.
  nb::dict cuda;
  for (auto [target, execute] : {std::pair<const char*, XLA_FFI_Handler*>{"jax_mla_decode", MlaDecodeCudaExecute},
                                 {"jax_mla_decode_schedule", MlaDecodeScheduleCudaExecute},
                                 {"jax_mla_decode_sparse", MlaDecodeSparseCudaExecute}}) {
    nb::dict stages;
    stages["initialize"] = handler_capsule(MlaDecodeCudaInitialize);
    stages["execute"] = handler_capsule(execute);
    cuda[target] = stages;
  }
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

nb::dict limits() {
  nb::dict d;
  for (const jax_mla::Limit& l : jax_mla::kLimits) d[l.name] = l.value;
  return d;
}

int64_t workspace_bytes(int64_t batch, int64_t rows, int64_t num_parts, int64_t max_chunks) {
  if (batch < 0) throw nb::value_error("batch must be >= 0");
  if (num_parts < 1) throw nb::value_error("num_parts must be >= 1");
  if (rows < 1) throw nb::value_error("rows must be >= 1");
  if (max_chunks < 0) throw nb::value_error("max_chunks must be >= 0");
  return jax_mla::workspace_layout(batch, rows, num_parts, max_chunks).total_bytes;
}

int64_t sparse_workspace_bytes(int64_t queries, int64_t heads_q, int64_t topk, int64_t num_parts, int64_t max_chunks) {
  if (queries < 0) throw nb::value_error("queries must be >= 0");
  if (heads_q < 1) throw nb::value_error("heads_q must be >= 1");
  if (topk < 1) throw nb::value_error("topk must be >= 1");
  if (num_parts < 1) throw nb::value_error("num_parts must be >= 1");
  if (max_chunks < 0) throw nb::value_error("max_chunks must be >= 0");
  return jax_mla::sparse_workspace_layout(queries, heads_q, topk, num_parts, max_chunks).total_bytes;
}

int invariant_max_chunks(int num_parts, int chunk_blocks, int64_t capacity_tokens) {
  if (num_parts < 1) throw nb::value_error("num_parts must be >= 1");
  if (chunk_blocks < 1) throw nb::value_error("chunk_blocks must be >= 1");
  return jax_mla::invariant_max_chunks(num_parts, chunk_blocks, capacity_tokens);
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
  d["fp8_kernel"] = info.fp8_kernel;
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
  m.doc() = "jax-mla native extension: XLA FFI handlers for MLA decode and what jax_mla needs of C++";

  m.def("registrations", &registrations,
        "{platform: {target: capsule or {stage: capsule}}} for jax.ffi.register_ffi_target.");
  m.def("has_cuda", &has_cuda, "True when the module was built with the CUDA kernels.");
  m.def("cuda_sm_count", &cuda_sm_count, "SM count of CUDA device 0; 0 without a device, a driver or CUDA support.");
  m.def("limits", &limits,
        "{name: int}: the limits the handlers check (cuda/runtime/limits.h), for jax_mla's own checks.");
  m.def("workspace_bytes", &workspace_bytes, nb::arg("batch"), nb::arg("rows"), nb::arg("num_parts"),
        nb::arg("max_chunks") = 0,
        "Bytes of the CUDA workspace result of jax_mla_decode (rows = s_q * h_q; max_chunks: the "
        "batch-invariant plan's most chunks per request, invariant_max_chunks, or 0).");
  m.def("sparse_workspace_bytes", &sparse_workspace_bytes, nb::arg("queries"), nb::arg("heads_q"), nb::arg("topk"),
        nb::arg("num_parts"), nb::arg("max_chunks") = 0,
        "Bytes of the CUDA workspace result of jax_mla_decode_sparse (queries = b * s_q; max_chunks: the "
        "batch-invariant plan's S, 0 for the default plans; common/workspace.h).");
  m.def("invariant_max_chunks", &invariant_max_chunks, nb::arg("num_parts"), nb::arg("chunk_blocks"),
        nb::arg("capacity_tokens"),
        "Most chunks per request of a batch-invariant plan (common/scheduler.h): num_parts, bounded by what a "
        "request of capacity_tokens (max_pages * page_size; -1 when unknown) needs.");
  m.def("built_kernels", &built_kernels, "Names of the GPU decode kernels compiled into this build.");
  m.def("kernel_info", &kernel_info, nb::arg("device_ordinal"),
        "Which kernel a CUDA device uses (initializes it for jax_mla if needed, self-check included).");
  nb::dict kernels;
  for (int32_t i = 0; i < jax_mla::kNumKernels; ++i) kernels[jax_mla::kKernelNames[i]] = i;
  m.attr("KERNELS") = kernels;
  nb::list fp8_kernels;  // the kernels that read an FP8 kv_cache (kernel_select.h kReadsFp8Cache)
  for (int32_t i = 1; i < jax_mla::kNumKernels; ++i) {
    if (jax_mla::kReadsFp8Cache[i]) fp8_kernels.append(jax_mla::kKernelNames[i]);
  }
  m.attr("FP8_KERNELS") = nb::tuple(fp8_kernels);

  jax_mla::python::define_testing(
      m.def_submodule("testing", "Test and benchmark hooks of jax_mla._ext; not part of jax_mla's API."));
}
