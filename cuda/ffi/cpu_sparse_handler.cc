// XLA FFI handler of the "cpu" platform for jax_mla_decode_sparse: checks the buffers
// (ffi/sparse_args.h), then every counted index on the host (an index that is neither -1 nor a
// slot of the cache ends the op with an error naming request, token and position, so the kernel
// never reads out of bounds), and runs the CPU kernel (cpu/sparse_cpu.h).
#include <cstdint>

#include "cpu/sparse_cpu.h"
#include "ffi/decode_args.h"
#include "ffi/handlers.h"
#include "ffi/sparse_args.h"
#include "runtime/settings.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace jax_mla {
namespace {

using ffi_args::invalid_argument;
using ffi_args::kSparseTarget;

ffi::Error check_indices(const SparseProblem& p) {
  for (int r = 0; r < p.batch; ++r) {
    const int count = sparse_count(p, r);
    for (int t = 0; t < p.seq_q; ++t) {
      const int32_t* idx = p.indices + (static_cast<int64_t>(r) * p.seq_q + t) * p.topk;
      for (int k = 0; k < count; ++k) {
        if (idx[k] == -1) continue;
        if (idx[k] < 0 || idx[k] >= p.num_slots) {
          return invalid_argument(kSparseTarget, "indices[", r, ", ", t, ", ", k, "] = ", idx[k],
                                  " (request ", r, ", query token ", t,
                                  ") is neither -1 nor a token slot in [0, num_pages * page_size) = [0, ",
                                  p.num_slots, ")");
        }
      }
    }
  }
  return ffi::Error::Success();
}

ffi::Error sparse_cpu_impl(ffi::AnyBuffer q, ffi::AnyBuffer kv_cache, ffi::AnyBuffer indices,
                           ffi::AnyBuffer topk_length, ffi::AnyBuffer attn_sink, ffi::Result<ffi::AnyBuffer> out,
                           ffi::Result<ffi::AnyBuffer> lse, float softmax_scale) {
  SparseProblem p{};
  if (ffi::Error e = ffi_args::check_sparse(q, kv_cache, indices, topk_length, attn_sink, *out, *lse, softmax_scale, &p);
      e.failure()) {
    return e;
  }
  const Setting<CpuIsa>& isa = settings().cpu_isa;
  if (!isa.ok()) return invalid_argument(kSparseTarget, isa.error);
  if (p.batch == 0) return ffi::Error::Success();
  if (ffi::Error e = check_indices(p); e.failure()) return e;
  decode_sparse_cpu(p, /*baseline_gemm=*/isa.value == CpuIsa::kGeneric);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jax_mla

XLA_FFI_DEFINE_HANDLER_SYMBOL(MlaDecodeSparseCpu, jax_mla::sparse_cpu_impl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()  // q
                                  .Arg<ffi::AnyBuffer>()  // kv_cache
                                  .Arg<ffi::AnyBuffer>()  // indices
                                  .Arg<ffi::AnyBuffer>()  // topk_length
                                  .Arg<ffi::AnyBuffer>()  // attn_sink
                                  .Ret<ffi::AnyBuffer>()  // out
                                  .Ret<ffi::AnyBuffer>()  // lse
                                  .Attr<float>("softmax_scale"));
