// XLA FFI handler of the "CUDA" platform for jax_mla_decode_sparse: checks the buffers as the CPU
// handler does (ffi/sparse_args.h), then what only the GPU path imposes, and launches it
// (runtime/sparse_launch.h: the call as a dense decode over one-token pages on the SM90 or SM100
// kernel for an FP8 cache where auto picks them, else the portable kernel). The indices are device data and are not read here:
// an index outside the cache makes its query token's output NaN on the device instead of an error.
//
// Beside the CPU target's operands and attribute it has a `workspace` result (the decode's scratch,
// the in-op schedule and the compacted block table: common/workspace.h sparse_workspace_layout) and
// `num_parts` and `chunk_blocks` attributes (the split-KV plan's parts and, for batch_invariant,
// its chunk in 64-token blocks, 0 otherwise: they size the workspace), all fixed at trace time by
// the CUDA lowering. Like jax_mla_decode's execute stage it allocates nothing and
// never synchronises (CUDA-graph safe), and shares its initialize stage (cuda_handler.cu).
#include <cuda_runtime.h>

#include <cstdint>

#include "common/scheduler.h"
#include "common/sparse_problem.h"
#include "common/workspace.h"
#include "ffi/cuda_errors.h"
#include "ffi/decode_args.h"
#include "ffi/handlers.h"
#include "ffi/sparse_args.h"
#include "runtime/device.h"
#include "runtime/kernel_select.h"
#include "runtime/limits.h"
#include "runtime/sparse_launch.h"

namespace ffi = ::xla::ffi;

namespace jax_mla {
namespace {

using ffi_args::invalid_argument;
using ffi_args::kSparseTarget;

// What only the GPU path imposes: the in-op schedule of b * s_q requests (the device scheduler's
// batch limit, an int32 schedule) and the workspace the lowering sized for it.
ffi::Error check_gpu_sparse(const SparseProblem& p, int32_t num_parts, int32_t chunk_blocks, int64_t workspace_bytes,
                            ChunkSpec* chunks) {
  const int64_t queries = static_cast<int64_t>(p.batch) * p.seq_q;
  if (queries > kMaxScheduleBatch) {
    return invalid_argument(kSparseTarget, "b * s_q = ", p.batch, " * ", p.seq_q, " = ", queries,
                            " query tokens exceed the GPU limit of ", kMaxScheduleBatch,
                            " (each is one request of the device scheduler)");
  }
  if (num_parts < 1 || schedule_size(queries, num_parts) > kIntMax) {
    return invalid_argument(kSparseTarget, "num_parts must be a positive int small enough for an int32 schedule, got ",
                            num_parts);
  }
  if (!ffi_args::chunk_blocks_ok(chunk_blocks)) {
    return invalid_argument(kSparseTarget, "chunk_blocks (batch_invariant's chunk in ", kBlockN,
                            "-token blocks) must be 0 or in [1, ", kMaxInvariantChunkBlocks, "], got ", chunk_blocks);
  }
  // A query token's request has at most topk tokens: S as the dense op plans it for its table.
  *chunks = chunk_blocks > 0 ? ChunkSpec{chunk_blocks, invariant_max_chunks(num_parts, chunk_blocks, p.topk)}
                             : ChunkSpec{0, 0};
  const int64_t need = sparse_workspace_layout(queries, p.heads_q, p.topk, num_parts, chunks->max_chunks).total_bytes;
  if (workspace_bytes < need) {
    return invalid_argument(kSparseTarget, "workspace has ", workspace_bytes, " bytes, needs ", need,
                            " (sparse_workspace_bytes(queries=", queries, ", heads_q=", p.heads_q, ", topk=", p.topk,
                            ", num_parts=", num_parts, ", max_chunks=", chunks->max_chunks, "))");
  }
  return ffi::Error::Success();
}

ffi::Error SparseExecuteImpl(cudaStream_t stream, ffi::AnyBuffer q, ffi::AnyBuffer kv_cache, ffi::AnyBuffer indices,
                             ffi::AnyBuffer topk_length, ffi::AnyBuffer attn_sink, ffi::Result<ffi::AnyBuffer> out,
                             ffi::Result<ffi::AnyBuffer> lse, ffi::Result<ffi::AnyBuffer> workspace,
                             float softmax_scale, int32_t num_parts, int32_t chunk_blocks) {
  SparseProblem p{};
  if (ffi::Error e = ffi_args::check_sparse(q, kv_cache, indices, topk_length, attn_sink, *out, *lse, softmax_scale, &p);
      e.failure()) {
    return e;
  }
  if (p.batch == 0) return ffi::Error::Success();  // nothing to launch (a grid of 0 CTAs is an error)
  ChunkSpec chunks{0, 0};
  if (ffi::Error e = check_gpu_sparse(p, num_parts, chunk_blocks, static_cast<int64_t>(workspace->size_bytes()), &chunks);
      e.failure()) {
    return e;
  }
  const DeviceState* device = nullptr;
  if (Status s = ready_device(kSparseTarget, &device); !s.ok()) return ffi_args::to_ffi(s);
  // The kernel (kernel_select.h sparse_kernel): for an FP8 cache, what auto picks for a dense decode
  // of that format (JAX_MLA_KERNEL and the self-check included) where that is SM90 or SM100, whose
  // producer warp gathers the one-token pages; otherwise, and for a 16-bit cache, the portable
  // kernel. The selection also refuses a device below compute capability 8.0 and an FP8 cache no
  // kernel there reads.
  const bool fp8 = p.kv_format == KvFormat::kFp8;
  const KernelSelection sel = select_on(*device, static_cast<int32_t>(Kernel::kAuto), fp8);
  if (!sel.error.empty()) return invalid_argument(kSparseTarget, sel.error);
  const Kernel kernel = sel.ok() ? sparse_kernel(sel.kernel, fp8) : Kernel::kPortable;
  const LaunchStatus st =
      launch_sparse_decode(p, num_parts, chunks, workspace->untyped_data(), device->sm_count, stream, kernel);
  if (!st.ok()) return ffi_args::launch_error(kSparseTarget, st);
  return ffi::Error::Success();
}

}  // namespace
}  // namespace jax_mla

XLA_FFI_DEFINE_HANDLER_SYMBOL(MlaDecodeSparseCudaExecute, jax_mla::SparseExecuteImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::PlatformStream<cudaStream_t>>()
                                  .Arg<ffi::AnyBuffer>()  // q            (b, s_q, h_q, 576)
                                  .Arg<ffi::AnyBuffer>()  // kv_cache     (num_pages, page_size, 576 | 656 u8)
                                  .Arg<ffi::AnyBuffer>()  // indices      (b, s_q, topk) s32
                                  .Arg<ffi::AnyBuffer>()  // topk_length  (0,) or (b,) s32
                                  .Arg<ffi::AnyBuffer>()  // attn_sink    (0,), (h_q,) or (b, h_q) f32
                                  .Ret<ffi::AnyBuffer>()  // out          (b, s_q, h_q, 512)
                                  .Ret<ffi::AnyBuffer>()  // lse          (b, s_q, h_q) f32
                                  .Ret<ffi::AnyBuffer>()  // workspace    (sparse_workspace_bytes,) u8
                                  .Attr<float>("softmax_scale")
                                  .Attr<int32_t>("num_parts")      // parts of the in-op split-KV plan
                                  .Attr<int32_t>("chunk_blocks"),  // 0, or the batch-invariant plan's chunk
                              {ffi::Traits::kCmdBufferCompatible});
