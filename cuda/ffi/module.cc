// The extension module jax_mla._ext: XLA FFI handler capsules for jax.ffi.register_ffi_target,
// plus the few native helpers the Python package needs (schedule / workspace sizes, the host
// schedule planner, CUDA device info). See docs/design.md ("FFI targets").
#include <cstdint>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "common/config.h"
#include "common/scheduler.h"
#include "common/workspace.h"
#include "ffi/handlers.h"
#ifdef JAX_MLA_WITH_CUDA
#include "ffi/device_query.h"
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
  d["sm90_cluster_row_blocks"] = st.sm90_cluster_row_blocks;
  d["sm90_max_active_clusters"] = st.sm90_max_active_clusters;
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
        "Split-KV schedule of int32 seq_lens (b,) for num_parts parts, planned on the host.");

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
