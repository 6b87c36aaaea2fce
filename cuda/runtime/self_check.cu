// See self_check.h. The problem: bf16 and fp16, b = 3 requests of lengths 0, 45 and 301 (s_q = 2,
// h_q = 16, causal, page size 32 so one 64-token tile spans two pages, pages in shuffled order),
// num_parts = 3 so the long request is split and the combine runs; every cache row past a length
// and every unused page holds NaN, so a kernel that lets such rows reach the output fails.
// Criteria: the same empty rows (out exactly 0, lse -inf), everything else finite, out within a
// relative L2 error of 2e-2 and lse within 1e-3 (relative, at least absolute) of the portable kernel
// (both round P to 16 bits; they only differ in fp32 summation order).
#include "runtime/self_check.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "common/problem.h"
#include "common/scheduler.h"
#include "common/workspace.h"
#include "runtime/decode_launch.h"

namespace jax_mla {
namespace {

constexpr int kBatch = 3, kSeqQ = 2, kHeads = 16, kRows = kSeqQ * kHeads, kPage = 32, kParts = 3;
constexpr int kLens[kBatch] = {0, 45, 301};
constexpr int kMaxPages = (301 + kPage - 1) / kPage + 1;  // one poisoned column past the longest
constexpr int kNumPages = 2 + 10 + 3;                     // used pages + 3 unused (NaN)

struct Lcg {  // deterministic inputs, no dependency on a host RNG library
  uint64_t s = 0x9E3779B97F4A7C15ull;
  uint32_t next() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(s >> 33);
  }
  float uniform() { return (next() & 0xFFFFFF) / 8388608.f - 1.f; }  // [-1, 1)
};

template <typename Element>
uint16_t to_bits(float x) {
  Element e;
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) e = __float2bfloat16(x);
  else e = __float2half(x);
  uint16_t b;
  std::memcpy(&b, &e, 2);
  return b;
}

template <typename Element>
float from_bits(uint16_t b) {
  Element e;
  std::memcpy(&e, &b, 2);
  if constexpr (std::is_same_v<Element, __nv_bfloat16>) return __bfloat162float(e);
  else return __half2float(e);
}

struct Problem {
  std::vector<uint16_t> q;       // (b, s_q, h_q, 576)
  std::vector<uint16_t> kv;      // (num_pages, page, 576)
  std::vector<int32_t> table;    // (b, max_pages)
  std::vector<int32_t> lens;     // (b,)
};

template <typename Element>
Problem make_problem() {
  Problem pr;
  Lcg rng;
  pr.q.resize(static_cast<size_t>(kBatch) * kRows * kHeadDimQK);
  for (auto& x : pr.q) x = to_bits<Element>(rng.uniform());
  pr.kv.assign(static_cast<size_t>(kNumPages) * kPage * kHeadDimQK, to_bits<Element>(NAN));
  // Pages in a shuffled order (Fisher-Yates with the LCG); unused table columns are invalid ids.
  std::vector<int32_t> ids(kNumPages);
  for (int i = 0; i < kNumPages; ++i) ids[i] = i;
  for (int i = kNumPages - 1; i > 0; --i) std::swap(ids[i], ids[rng.next() % (i + 1)]);
  pr.table.assign(static_cast<size_t>(kBatch) * kMaxPages, -1);
  int next = 0;
  for (int r = 0; r < kBatch; ++r) {
    for (int i = 0; i * kPage < kLens[r]; ++i) {
      const int page = ids[next++];
      pr.table[r * kMaxPages + i] = page;
      for (int row = 0; row < kPage && i * kPage + row < kLens[r]; ++row)
        for (int c = 0; c < kHeadDimQK; ++c)
          pr.kv[(static_cast<size_t>(page) * kPage + row) * kHeadDimQK + c] = to_bits<Element>(rng.uniform());
    }
  }
  pr.lens.assign(kLens, kLens + kBatch);
  return pr;
}

struct Result {
  std::vector<float> out;  // (b * rows, 512)
  std::vector<float> lse;  // (b * rows)
};

// Device buffers of one run; one stream-ordered allocation.
struct Buffers {
  uint8_t* base = nullptr;
  size_t q, kv, table, lens, out, lse, ws, total;
};

Buffers layout() {
  Buffers b;
  size_t off = 0;
  auto take = [&](size_t bytes) { const size_t at = off; off += (bytes + 255) / 256 * 256; return at; };
  b.q = take(static_cast<size_t>(kBatch) * kRows * kHeadDimQK * 2);
  b.kv = take(static_cast<size_t>(kNumPages) * kPage * kHeadDimQK * 2);
  b.table = take(kBatch * kMaxPages * 4);
  b.lens = take(kBatch * 4);
  b.out = take(static_cast<size_t>(kBatch) * kRows * kHeadDimV * 2);
  b.lse = take(kBatch * kRows * 4);
  b.ws = take(static_cast<size_t>(workspace_layout(kBatch, kRows, kParts).total_bytes));
  b.total = off;
  return b;
}

std::string cuda_failure(const char* what, cudaError_t e) {
  cudaGetLastError();  // clear a non-sticky error so it does not surface in an unrelated call
  return std::string(what) + ": " + cudaGetErrorName(e);
}

template <typename Element>
bool run_one(Kernel kernel, const Buffers& b, cudaStream_t stream, Result* res, std::string* error) {
  DecodeProblem p{};
  p.batch = kBatch;
  p.seq_q = kSeqQ;
  p.heads_q = kHeads;
  p.rows = kRows;
  p.num_pages = kNumPages;
  p.page_size = kPage;
  p.max_pages = kMaxPages;
  p.num_parts = kParts;
  p.dtype = std::is_same_v<Element, __nv_bfloat16> ? DType::kBF16 : DType::kF16;
  p.softmax_scale = 1.f / 24.f;  // 576 ** -0.5
  p.causal = true;
  p.q = b.base + b.q;
  p.kv_cache = b.base + b.kv;
  p.block_table = reinterpret_cast<const int32_t*>(b.base + b.table);
  p.seq_lens = reinterpret_cast<const int32_t*>(b.base + b.lens);
  p.schedule = nullptr;  // planned in the op, as by default
  p.out = b.base + b.out;
  p.lse = reinterpret_cast<float*>(b.base + b.lse);
  const WorkspaceLayout w = workspace_layout(kBatch, kRows, kParts);
  uint8_t* ws = b.base + b.ws;
  p.partial_lse = reinterpret_cast<float*>(ws + w.partial_lse_offset);
  p.partial_out = reinterpret_cast<float*>(ws + w.partial_out_offset);
  // Poison the outputs so a kernel that skips rows is caught.
  cudaError_t e = cudaMemsetAsync(b.base + b.out, 0xFF, static_cast<size_t>(kBatch) * kRows * kHeadDimV * 2, stream);
  if (e == cudaSuccess) e = cudaMemsetAsync(b.base + b.lse, 0xFF, kBatch * kRows * 4, stream);
  if (e != cudaSuccess) return *error = cuda_failure("cudaMemsetAsync", e), false;
  const LaunchStatus st = launch_decode_kernel(kernel, p, /*sm_count=*/0, /*merge_counters=*/nullptr,
                                               reinterpret_cast<int32_t*>(ws + w.schedule_offset), stream);
  if (!st.ok()) {
    *error = st.error != cudaSuccess ? cuda_failure(st.what, st.error) : std::string(st.what);
    return false;
  }
  std::vector<uint16_t> out(static_cast<size_t>(kBatch) * kRows * kHeadDimV);
  res->lse.resize(kBatch * kRows);
  e = cudaMemcpyAsync(out.data(), b.base + b.out, out.size() * 2, cudaMemcpyDeviceToHost, stream);
  if (e == cudaSuccess) e = cudaMemcpyAsync(res->lse.data(), b.base + b.lse, res->lse.size() * 4, cudaMemcpyDeviceToHost, stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) return *error = cuda_failure(kernel == Kernel::kPortable ? "portable run" : "candidate run", e), false;
  res->out.resize(out.size());
  for (size_t i = 0; i < out.size(); ++i) res->out[i] = from_bits<Element>(out[i]);
  return true;
}

// Empty string when `got` (candidate) agrees with `want` (portable).
std::string compare(const Result& got, const Result& want) {
  double num = 0, den = 0;
  for (int row = 0; row < kBatch * kRows; ++row) {
    const float gl = got.lse[row], wl = want.lse[row];
    const bool empty = wl == -INFINITY;
    if (std::isnan(wl) || (!empty && !std::isfinite(wl))) return "the portable kernel's lse is not finite at row " + std::to_string(row);
    if (empty != (gl == -INFINITY)) return "lse -inf pattern differs at row " + std::to_string(row);
    if (!empty && !(std::fabs(gl - wl) <= 1e-3f * std::fmax(1.f, std::fabs(wl)))) {
      return "lse differs at row " + std::to_string(row) + " (" + std::to_string(gl) + " vs " + std::to_string(wl) + ")";
    }
    for (int c = 0; c < kHeadDimV; ++c) {
      const float g = got.out[static_cast<size_t>(row) * kHeadDimV + c];
      const float w = want.out[static_cast<size_t>(row) * kHeadDimV + c];
      if (!std::isfinite(g)) return "out is not finite at row " + std::to_string(row);
      if (empty && g != 0.f) return "out is not 0 on the empty row " + std::to_string(row);
      num += (static_cast<double>(g) - w) * (static_cast<double>(g) - w);
      den += static_cast<double>(w) * w;
    }
  }
  const double rel = std::sqrt(num / (den > 0 ? den : 1e-30));
  if (!(rel <= 2e-2)) return "out differs (relative L2 error " + std::to_string(rel) + " > 0.02)";
  return "";
}

template <typename Element>
std::string check_dtype(Kernel candidate, bool inject_fault, const Buffers& b, cudaStream_t stream) {
  const Problem pr = make_problem<Element>();
  cudaError_t e = cudaMemcpyAsync(b.base + b.q, pr.q.data(), pr.q.size() * 2, cudaMemcpyHostToDevice, stream);
  if (e == cudaSuccess) e = cudaMemcpyAsync(b.base + b.kv, pr.kv.data(), pr.kv.size() * 2, cudaMemcpyHostToDevice, stream);
  if (e == cudaSuccess) e = cudaMemcpyAsync(b.base + b.table, pr.table.data(), pr.table.size() * 4, cudaMemcpyHostToDevice, stream);
  if (e == cudaSuccess) e = cudaMemcpyAsync(b.base + b.lens, pr.lens.data(), pr.lens.size() * 4, cudaMemcpyHostToDevice, stream);
  if (e != cudaSuccess) return cuda_failure("cudaMemcpyAsync", e);
  Result got, want;
  std::string error;
  if (!run_one<Element>(candidate, b, stream, &got, &error)) return error;
  if (!run_one<Element>(Kernel::kPortable, b, stream, &want, &error)) return error;
  if (inject_fault) got.out[static_cast<size_t>(kRows) * kHeadDimV] += 1.f;  // request 1, row 0, column 0
  return compare(got, want);
}

}  // namespace

SelfCheckReport run_self_check(Kernel candidate, bool inject_fault) {
  SelfCheckReport report;
  cudaStream_t stream = nullptr;
  cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (e != cudaSuccess) {
    report.detail = cuda_failure("cudaStreamCreateWithFlags", e);
    return report;
  }
  Buffers b = layout();
  e = cudaMallocAsync(reinterpret_cast<void**>(&b.base), b.total, stream);
  if (e != cudaSuccess) {
    report.detail = cuda_failure("cudaMallocAsync", e);
  } else {
    std::string d = check_dtype<__nv_bfloat16>(candidate, inject_fault, b, stream);
    if (!d.empty()) d = "bfloat16: " + d;
    if (d.empty()) {
      d = check_dtype<__half>(candidate, inject_fault, b, stream);
      if (!d.empty()) d = "float16: " + d;
    }
    report.detail = d;
    report.passed = d.empty();
    cudaFreeAsync(b.base, stream);
  }
  if (cudaStreamSynchronize(stream) != cudaSuccess || cudaStreamDestroy(stream) != cudaSuccess) cudaGetLastError();
  return report;
}

}  // namespace jax_mla
