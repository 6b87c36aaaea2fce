// See decode_launch.h. The only place that knows each kernel's launch sequence.
#include "runtime/decode_launch.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "common/launch.h"
#include "common/tensor_map.h"
#include "common/workspace.h"
#include "portable/launch.h"
#include "sm90/launch.h"
// The SM100 kernel (cuda/sm100, sm100/launch.h): setup_decode<Element, KvFormat>() and
// launch_decode<Element, KvFormat>(p, q_map, kv_map, kv_rope_map, kv_scale_map, stream), on the same
// TMA descriptors as SM90's (an FP8 cache's views included).
// JAX_MLA_HAVE_SM100 / JAX_MLA_HAVE_SM103 are defined by the build when it compiles cuda/sm100 for
// sm_100a / sm_103a; without them kernel="sm100" is "not in this build".
#if defined(JAX_MLA_HAVE_SM100) || defined(JAX_MLA_HAVE_SM103)
#include "sm100/launch.h"
#define JAX_MLA_ANY_SM100 1
#endif

namespace jax_mla {

BuiltKernels built_kernels() {
  BuiltKernels b;
#ifdef JAX_MLA_HAVE_SM90
  b.sm90 = true;
#endif
#ifdef JAX_MLA_HAVE_SM100
  b.sm100 = true;
#endif
#ifdef JAX_MLA_HAVE_SM103
  b.sm103 = true;
#endif
  return b;
}

cudaError_t setup_decode_kernels(int cc_major, int cc_minor) {
  if (cc_major < 8) return cudaSuccess;  // no kernel runs there (the selection refuses the call)
  cudaError_t e = portable::setup_decode<__nv_bfloat16>();
  if (e == cudaSuccess) e = portable::setup_decode<__half>();
  if (e == cudaSuccess) e = portable::setup_decode<__nv_bfloat16, KvFormat::kFp8>();
  if (e == cudaSuccess) e = portable::setup_decode<__half, KvFormat::kFp8>();
#ifdef JAX_MLA_HAVE_SM90
  if (e == cudaSuccess && cc_major == 9 && cc_minor == 0) {
    e = sm90::setup_decode<__nv_bfloat16>();
    if (e == cudaSuccess) e = sm90::setup_decode<__half>();
    if (e == cudaSuccess) e = sm90::setup_decode<__nv_bfloat16, KvFormat::kFp8>();
    if (e == cudaSuccess) e = sm90::setup_decode<__half, KvFormat::kFp8>();
  }
#endif
  (void)cc_minor;
  return e;
}

cudaError_t setup_sm100_kernel() {
#ifdef JAX_MLA_ANY_SM100
  cudaError_t e = sm100::setup_decode<__nv_bfloat16>();
  if (e == cudaSuccess) e = sm100::setup_decode<__half>();
  if (e == cudaSuccess) e = sm100::setup_decode<__nv_bfloat16, KvFormat::kFp8>();
  if (e == cudaSuccess) e = sm100::setup_decode<__half, KvFormat::kFp8>();
  return e;
#else
  return cudaErrorInvalidDeviceFunction;
#endif
}

namespace {

// The TMA descriptors of the SM90 / SM100 kernels: (b * s_q * h_q, 576) for Q in boxes of
// (64, 64); (num_pages * page_size, 576) for the cache in boxes of (min(page_size, 64), 64).
bool make_q_map(const DecodeProblem& p, CUtensorMap* q_map, const char** error) {
  return make_tensor_map_2d(q_map, p.q, p.dtype, static_cast<uint64_t>(p.batch) * p.rows, kHeadDimQK, kHeadDimQK,
                            kBlockM, 64, error);
}

uint32_t kv_box_rows(const DecodeProblem& p) { return p.page_size < kBlockN ? p.page_size : kBlockN; }

bool make_decode_maps(const DecodeProblem& p, CUtensorMap* q_map, CUtensorMap* kv_map, const char** error) {
  return make_q_map(p, q_map, error) &&
         make_tensor_map_2d(kv_map, p.kv_cache, p.dtype, static_cast<uint64_t>(p.num_pages) * p.page_size,
                            kHeadDimQK, kHeadDimQK, kv_box_rows(p), 64, error);
}

// The SM90 and SM100 kernels' views of an FP8 cache (sm90/launch.h, sm100/launch.h): the e4m3 bytes
// in boxes of (rows, 128), the RoPE values as bf16 (328 a row, 64 from column 264) with the 128-byte
// swizzle, the scales in boxes of (rows, 16) bytes.
bool make_fp8_maps(const DecodeProblem& p, CUtensorMap* q_map, CUtensorMap* bytes_map, CUtensorMap* rope_map,
                   CUtensorMap* scale_map, const char** error) {
  const uint64_t tokens = static_cast<uint64_t>(p.num_pages) * p.page_size;
  return make_q_map(p, q_map, error) &&
         make_tensor_map_bytes(bytes_map, p.kv_cache, tokens, kFp8RowBytes, kv_box_rows(p), kFp8TileCols, error) &&
         make_tensor_map_2d(rope_map, p.kv_cache, DType::kBF16, tokens, kFp8RowBytes / 2, kFp8RowBytes / 2,
                            kv_box_rows(p), 64, error) &&
         make_tensor_map_bytes(scale_map, p.kv_cache, tokens, kFp8RowBytes, kv_box_rows(p), 4 * kFp8Tiles, error);
}

// Calls f(Element{}, std::integral_constant<KvFormat, kFormat>{}) with the problem's element type and
// cache format, so that each kernel's launch is written once over the four instantiations.
template <typename F>
cudaError_t with_instantiation(bool bf16, bool fp8, F f) {
  const auto by_format = [&](auto element) {
    return fp8 ? f(element, std::integral_constant<KvFormat, KvFormat::kFp8>{})
               : f(element, std::integral_constant<KvFormat, KvFormat::kDense>{});
  };
  return bf16 ? by_format(__nv_bfloat16{}) : by_format(__half{});
}

}  // namespace

LaunchStatus launch_decode_kernel(Kernel kernel, DecodeProblem p, int sm_count, int* merge_counters,
                                  int32_t* schedule_scratch, cudaStream_t stream, const WatchdogParams* watchdog) {
  LaunchStatus st;
  const bool bf16 = p.dtype == DType::kBF16;
  const bool fp8 = p.kv_format == KvFormat::kFp8;
  if (fp8 && !reads_fp8_cache(kernel)) {  // kernel_select.h never picks one; a backstop
    st.error = cudaErrorNotSupported;
    st.what = "an FP8 kv_cache reaches only kernels that read it (kernel_select.h kReadsFp8Cache)";
    return st;
  }
  CUtensorMap q_map, kv_map, kv_group_map, kv_scale_map;
  if ((kernel == Kernel::kSm90 || kernel == Kernel::kSm100) && fp8) {
    if (!make_fp8_maps(p, &q_map, &kv_map, &kv_group_map, &kv_scale_map, &st.what)) return st;
  } else if (kernel == Kernel::kSm90 || kernel == Kernel::kSm100) {
    if (!make_decode_maps(p, &q_map, &kv_map, &st.what)) return st;  // what = the driver's reason
    // SM90's grouped copies (kv_producer.cuh kBoxesPerGroup): the column-box view, pages of >= 64
    // tokens only (the kernel uses it only then); otherwise a copy of kv_map stands in, unused.
    kv_group_map = kv_map;
    if (kernel == Kernel::kSm90 && p.page_size >= kBlockN &&
        !make_tensor_map_col_boxes(&kv_group_map, p.kv_cache, p.dtype, static_cast<uint64_t>(p.num_pages) * p.page_size,
                                   kHeadDimQK, kHeadDimQK, kBlockN, kBoxesPerGroup, &st.what)) {
      return st;
    }
    kv_scale_map = kv_map;  // unused
  }
  // The SM90 kernel merges split requests itself where its grid fits at once and the caller gave
  // the arrival counters (sm90/split_merge.cuh): they start at zero, and no combine kernel follows.
#ifdef JAX_MLA_HAVE_SM90
  const sm90::LaunchPlan sm90_plan =
      sm90::make_launch_plan(p, sm_count, kernel == Kernel::kSm90 && watchdog == nullptr ? merge_counters : nullptr);
  const bool fused_merge = sm90_plan.fused_merge;
#else
  const bool fused_merge = false;
#endif
  // The merge's counters are zeroed by the scheduler kernel when it runs (an operation less per
  // call), by a memset when the caller passed a precomputed schedule.
  const int64_t counter_bytes = fused_merge ? merge_counters_bytes(p.batch, p.rows) : 0;
  if (fused_merge && p.schedule != nullptr) {
    if ((st.error = cudaMemsetAsync(merge_counters, 0, counter_bytes, stream)) != cudaSuccess) {
      st.what = "merge counter reset";
      return st;
    }
  }
  st.fused_merge = fused_merge;
  if (p.schedule == nullptr) {
    if ((st.error = launch_schedule(p.seq_lens, p.batch, p.num_parts, schedule_scratch, stream, merge_counters,
                                    static_cast<int>(counter_bytes / sizeof(int32_t)), p.chunks)) != cudaSuccess) {
      st.what = "scheduler launch";
      return st;
    }
    p.schedule = schedule_scratch;
  }
  // The SM90 / SM100 kernels wait for the scheduler and hand over to the combine with programmatic
  // dependent launch; the portable path runs in plain stream order (its code may come from PTX
  // compiled without griddepcontrol).
  bool programmatic = true;
  switch (kernel) {
    case Kernel::kSm90:
#ifdef JAX_MLA_HAVE_SM90
      st.error = with_instantiation(bf16, fp8, [&](auto element, auto format) {
        return sm90::launch_decode<decltype(element), decltype(format)::value>(p, sm90_plan, q_map, kv_map, kv_group_map,
                                                                              kv_scale_map, stream, watchdog);
      });
#else
      st.error = cudaErrorInvalidDeviceFunction;
#endif
      break;
    case Kernel::kSm100:
#ifdef JAX_MLA_ANY_SM100
      // kv_group_map: the RoPE view of an FP8 cache (unused for a 16-bit one).
      st.error = with_instantiation(bf16, fp8, [&](auto element, auto format) {
        return sm100::launch_decode<decltype(element), decltype(format)::value>(p, q_map, kv_map, kv_group_map,
                                                                               kv_scale_map, stream, watchdog);
      });
#else
      st.error = cudaErrorInvalidDeviceFunction;
#endif
      break;
    default:
      programmatic = false;
      st.error = with_instantiation(bf16, fp8, [&](auto element, auto format) {
        return portable::launch_decode<decltype(element), decltype(format)::value>(p, stream);
      });
      break;
  }
  if (st.error != cudaSuccess) {
    st.what = "decode kernel launch";
    return st;
  }
  if (fused_merge) return st;
  if ((st.error = launch_combine(p, sm_count, programmatic, stream)) != cudaSuccess) st.what = "combine kernel launch";
  return st;
}

}  // namespace jax_mla
