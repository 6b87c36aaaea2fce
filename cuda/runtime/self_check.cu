// See self_check.h. The problems are the cases of runtime/self_check_cases.h (each in bf16 and fp16,
// over the 16-bit cache and, for a candidate that reads it, over the FP8 cache against the portable
// kernel's FP8 path), run one after the other through the launch path of the execute stage
// (runtime/decode_launch.h): the candidate's watchdog instantiation first, then the portable kernel,
// on the same inputs, in one stream-ordered allocation sized for the largest case (a few MB).
// Criteria, per case: the device computed the schedule the case table names (so the CPU test's
// coverage claims hold for what ran); the candidate's watchdog did not expire; the same NaN rows
// (the requests with a bad page id, or over an FP8 cache with a NaN e4m3 byte they read: every out
// and lse value NaN) and the same empty rows (out exactly 0, lse -inf); everything else finite; out
// within a relative L2 error of 2e-2 over the case and 5e-2 in every row, lse within 1e-3 (relative,
// at least absolute) of the portable kernel (both round P to 16 bits; they differ in fp32 summation
// order and in the reference max P is taken against; over an FP8 cache both dequantize exactly as
// unpack_fp8_kv, so the same bounds hold).
#include "runtime/self_check.h"

#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common/problem.h"
#include "common/scheduler.h"
#include "common/watchdog_params.h"
#include "common/workspace.h"
#include "runtime/decode_launch.h"
#include "runtime/self_check_cases.h"

namespace jax_mla {
namespace {

using self_check::Case;
using self_check::Inputs;
using self_check::Layout;

// Fault injection of JAX_MLA_SELFCHECK=hang: the CTA-local tile whose box 0 never arrives (every
// CTA of the first case has at least two tiles).
constexpr int kHangTile = 1;

struct Result {
  std::vector<float> out;  // (b * rows, 512)
  std::vector<float> lse;  // (b * rows)
};

std::string cuda_failure(const char* what, cudaError_t e) {
  cudaGetLastError();  // clear a non-sticky error so it does not surface in an unrelated call
  return std::string(what) + ": " + cudaGetErrorName(e);
}

// What one kernel's run of one case needs.
struct RunContext {
  const Case& c;
  DType dtype;
  KvFormat format;
  const Inputs& in;
  const Layout& at;
  uint8_t* base;  // the allocation
  cudaStream_t stream;
  cudaEvent_t start, stop;
};

DecodeProblem problem_of(const RunContext& r) {
  const Case& c = r.c;
  DecodeProblem p{};
  p.batch = c.batch;
  p.seq_q = c.seq_q;
  p.heads_q = c.heads_q;
  p.rows = c.rows();
  p.num_pages = r.in.num_pages;
  p.page_size = c.page_size;
  p.max_pages = r.in.max_pages;
  p.num_parts = c.num_parts;
  p.dtype = r.dtype;
  p.kv_format = r.format;
  p.softmax_scale = self_check::kSoftmaxScale;
  p.causal = c.causal;
  p.q = r.base + r.at.q;
  p.kv_cache = r.base + r.at.kv;
  p.block_table = reinterpret_cast<const int32_t*>(r.base + r.at.table);
  p.seq_lens = reinterpret_cast<const int32_t*>(r.base + r.at.lens);
  p.schedule = nullptr;  // planned in the op, as by default
  p.out = r.base + r.at.out;
  p.lse = reinterpret_cast<float*>(r.base + r.at.lse);
  const WorkspaceLayout w = workspace_layout(c.batch, c.rows(), c.num_parts);
  uint8_t* ws = r.base + r.at.workspace;
  p.partial_lse = reinterpret_cast<float*>(ws + w.partial_lse_offset);
  p.partial_out = reinterpret_cast<float*>(ws + w.partial_out_offset);
  return p;
}

// One kernel on the case; `watchdog` for the candidate. Fills res, adds the kernels' device time to
// *device_ms; when schedule is given, also returns the schedule the device planned, and when
// expired is given, the watchdog's flag.
bool run_one(const RunContext& r, Kernel kernel, const WatchdogParams* watchdog, Result* res, float* device_ms,
             std::vector<int32_t>* schedule, int* expired, std::string* error) {
  const DecodeProblem p = problem_of(r);
  const size_t rows = static_cast<size_t>(p.batch) * p.rows;
  // Poison the outputs so a kernel that skips rows is caught.
  cudaError_t e = cudaMemsetAsync(r.base + r.at.out, 0xFF, rows * kHeadDimV * 2, r.stream);
  if (e == cudaSuccess) e = cudaMemsetAsync(r.base + r.at.lse, 0xFF, rows * 4, r.stream);
  if (e == cudaSuccess) e = cudaMemsetAsync(r.base + r.at.expired, 0, 4, r.stream);
  if (e == cudaSuccess) e = cudaEventRecord(r.start, r.stream);
  if (e != cudaSuccess) return *error = cuda_failure("cudaMemsetAsync", e), false;
  int32_t* schedule_scratch =
      reinterpret_cast<int32_t*>(r.base + r.at.workspace + workspace_layout(p.batch, p.rows, p.num_parts).schedule_offset);
  const LaunchStatus st = launch_decode_kernel(kernel, p, /*sm_count=*/0, /*merge_counters=*/nullptr, schedule_scratch,
                                               r.stream, watchdog);
  if (!st.ok()) {
    *error = st.error != cudaSuccess ? cuda_failure(st.what, st.error) : std::string(st.what);
    return false;
  }
  std::vector<uint16_t> out(rows * kHeadDimV);
  res->lse.resize(rows);
  e = cudaEventRecord(r.stop, r.stream);
  if (e == cudaSuccess) e = cudaMemcpyAsync(out.data(), p.out, out.size() * 2, cudaMemcpyDeviceToHost, r.stream);
  if (e == cudaSuccess) e = cudaMemcpyAsync(res->lse.data(), p.lse, rows * 4, cudaMemcpyDeviceToHost, r.stream);
  if (e == cudaSuccess && schedule != nullptr) {
    schedule->resize(static_cast<size_t>(schedule_size(p.batch, p.num_parts)));
    e = cudaMemcpyAsync(schedule->data(), schedule_scratch, schedule->size() * 4, cudaMemcpyDeviceToHost, r.stream);
  }
  if (e == cudaSuccess && expired != nullptr) {
    e = cudaMemcpyAsync(expired, r.base + r.at.expired, 4, cudaMemcpyDeviceToHost, r.stream);
  }
  if (e == cudaSuccess) e = cudaStreamSynchronize(r.stream);
  float ms = 0.f;
  if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, r.start, r.stop);
  if (e != cudaSuccess) {
    return *error = cuda_failure(kernel == Kernel::kPortable ? "portable run" : "candidate run", e), false;
  }
  *device_ms += ms;
  res->out.resize(out.size());
  for (size_t i = 0; i < out.size(); ++i) res->out[i] = self_check::from_bits(out[i], r.dtype);
  return true;
}

// Empty string when `got` (candidate) agrees with `want` (portable) on case c over a cache of format f.
std::string compare(const Case& c, KvFormat f, const Result& got, const Result& want) {
  double num = 0, den = 0;
  const int rows = c.batch * c.rows();
  for (int row = 0; row < rows; ++row) {
    const std::string at = " at request " + std::to_string(row / c.rows()) + " row " + std::to_string(row % c.rows());
    const float gl = got.lse[row], wl = want.lse[row];
    const float* g = &got.out[static_cast<size_t>(row) * kHeadDimV];
    const float* w = &want.out[static_cast<size_t>(row) * kHeadDimV];
    if (self_check::nan_request(c, f, row / c.rows())) {  // a bad page id or NaN data: NaN everywhere, in both
      const std::string why = row / c.rows() == c.bad_request ? " for a bad page id" : " for a NaN e4m3 byte";
      if (!std::isnan(wl)) return "the portable kernel's lse is not NaN" + why + at;
      if (!std::isnan(gl)) return "lse is not NaN" + why + at;
      for (int col = 0; col < kHeadDimV; ++col) {
        if (!std::isnan(g[col])) return "out is not NaN" + why + at;
      }
      continue;
    }
    const bool empty = wl == -INFINITY;
    if (std::isnan(wl) || (!empty && !std::isfinite(wl))) return "the portable kernel's lse is not finite" + at;
    if (empty != (gl == -INFINITY)) return "lse -inf pattern differs" + at;
    if (!empty && !(std::fabs(gl - wl) <= 1e-3f * std::fmax(1.f, std::fabs(wl)))) {
      return "lse differs" + at + " (" + std::to_string(gl) + " vs " + std::to_string(wl) + ")";
    }
    double row_num = 0, row_den = 0;
    for (int col = 0; col < kHeadDimV; ++col) {
      if (!std::isfinite(g[col])) return "out is not finite" + at;
      if (empty && g[col] != 0.f) return "out is not 0 on an empty row" + at;
      row_num += (static_cast<double>(g[col]) - w[col]) * (static_cast<double>(g[col]) - w[col]);
      row_den += static_cast<double>(w[col]) * w[col];
    }
    if (!empty && !(std::sqrt(row_num / (row_den > 0 ? row_den : 1e-30)) <= 5e-2)) {
      return "out differs" + at + " (relative L2 error " + std::to_string(std::sqrt(row_num / row_den)) + " > 0.05)";
    }
    num += row_num;
    den += row_den;
  }
  const double rel = std::sqrt(num / (den > 0 ? den : 1e-30));
  if (!(rel <= 2e-2)) return "out differs (relative L2 error " + std::to_string(rel) + " > 0.02)";
  return "";
}

// The first row with a visible key and no NaN (where the fault mode corrupts the candidate).
int first_checked_row(const Case& c, KvFormat f, const Result& want) {
  for (int row = 0; row < c.batch * c.rows(); ++row) {
    if (!self_check::nan_request(c, f, row / c.rows()) && std::isfinite(want.lse[row])) return row;
  }
  return 0;
}

struct CheckState {
  Kernel candidate;
  SelfCheckMode mode;
  uint64_t budget_ns;
  bool fault_injected = false;
  SelfCheckReport* report;
};

std::string check_case(CheckState& s, const Case& c, DType dtype, KvFormat format, uint8_t* base,
                       cudaStream_t stream, cudaEvent_t start, cudaEvent_t stop) {
  const Inputs in = self_check::make_inputs(c, dtype, format);
  const Layout at = self_check::layout_of(c);
  const bool fp8 = format == KvFormat::kFp8;
  const void* kv = fp8 ? static_cast<const void*>(in.kv_fp8.data()) : static_cast<const void*>(in.kv.data());
  const size_t kv_bytes = fp8 ? in.kv_fp8.size() : in.kv.size() * 2;
  cudaError_t e = cudaMemcpyAsync(base + at.q, in.q.data(), in.q.size() * 2, cudaMemcpyHostToDevice, stream);
  if (e == cudaSuccess) e = cudaMemcpyAsync(base + at.kv, kv, kv_bytes, cudaMemcpyHostToDevice, stream);
  if (e == cudaSuccess) {
    e = cudaMemcpyAsync(base + at.table, in.table.data(), in.table.size() * 4, cudaMemcpyHostToDevice, stream);
  }
  if (e == cudaSuccess) e = cudaMemcpyAsync(base + at.lens, in.lens.data(), in.lens.size() * 4, cudaMemcpyHostToDevice, stream);
  if (e != cudaSuccess) return cuda_failure("cudaMemcpyAsync", e);
  const RunContext run{c, dtype, format, in, at, base, stream, start, stop};

  WatchdogParams watchdog;
  watchdog.budget_ns = s.budget_ns;
  watchdog.expired = reinterpret_cast<int*>(base + at.expired);
  watchdog.withhold_tile = s.mode == SelfCheckMode::kHang ? kHangTile : -1;
  Result got, want;
  std::vector<int32_t> schedule;
  int expired = 0;
  std::string error;
  const auto t0 = std::chrono::steady_clock::now();
  const bool ran =
      run_one(run, s.candidate, &watchdog, &got, &s.report->device_ms, &schedule, &expired, &error);
  const double candidate_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!ran) return error;
  if (expired != 0) {
    s.report->watchdog_expired = true;
    return "the watchdog expired: a barrier wait of the " + std::string(kernel_name(s.candidate)) +
           " kernel did not complete within " + std::to_string(s.budget_ns / 1000000) + " ms (the run took " +
           std::to_string(static_cast<int>(candidate_s * 1000)) + " ms)";
  }
  if (schedule != self_check::schedule_of(c)) return "the device's schedule differs from the host plan";
  if (!run_one(run, Kernel::kPortable, nullptr, &want, &s.report->device_ms, nullptr, nullptr, &error)) return error;
  if (s.mode == SelfCheckMode::kFault && !s.fault_injected) {
    got.out[static_cast<size_t>(first_checked_row(c, format, want)) * kHeadDimV] += 1.f;
    s.fault_injected = true;
  }
  return compare(c, format, got, want);
}

}  // namespace

SelfCheckReport run_self_check(Kernel candidate, SelfCheckMode mode, uint64_t watchdog_budget_ns) {
  const auto t0 = std::chrono::steady_clock::now();
  SelfCheckReport report;
  CheckState state{candidate, mode, watchdog_budget_ns, false, &report};
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaEventCreate(&start);
  if (e == cudaSuccess) e = cudaEventCreate(&stop);
  uint8_t* base = nullptr;
  if (e != cudaSuccess) {
    report.detail = cuda_failure("cudaStreamCreateWithFlags / cudaEventCreate", e);
  } else if ((e = cudaMallocAsync(reinterpret_cast<void**>(&base), self_check::device_bytes(), stream)) != cudaSuccess) {
    report.detail = cuda_failure("cudaMallocAsync", e);
  } else {
    for (KvFormat format : self_check::kv_formats(reads_fp8_cache(candidate))) {
      for (DType dtype : self_check::kDTypes) {
        for (const Case& c : self_check::cases()) {
          if (!self_check::runs_in(c, format)) continue;
          const std::string d = check_case(state, c, dtype, format, base, stream, start, stop);
          if (!d.empty()) {
            report.detail = std::string(self_check::dtype_name(dtype)) +
                            (format == KvFormat::kFp8 ? " over an FP8 cache" : "") + ", case '" + c.name + "': " + d;
            break;
          }
          ++report.cases;
        }
        if (!report.detail.empty()) break;
      }
      if (!report.detail.empty()) break;
    }
    report.passed = report.detail.empty();
    cudaFreeAsync(base, stream);
  }
  if (stream != nullptr && (cudaStreamSynchronize(stream) != cudaSuccess || cudaStreamDestroy(stream) != cudaSuccess)) {
    cudaGetLastError();
  }
  if (start != nullptr) cudaEventDestroy(start);
  if (stop != nullptr) cudaEventDestroy(stop);
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return report;
}

}  // namespace jax_mla
