"""FFI target registration and per-platform lowering of the jax_mla primitives.

Targets and their buffer order are the contract of docs/design.md ("FFI targets"):

  jax_mla_decode(q, kv_cache, block_table, seq_lens, schedule)
      -> out, lse [, workspace u8 on CUDA]; attrs softmax_scale f32, causal bool, num_parts i32,
         kernel i32 (_validate.KERNELS; the CPU handler checks it and ignores it), chunk_blocks i32
         (0, or the batch-invariant plan's chunk in 64-token blocks)
  jax_mla_decode_schedule(seq_lens) -> schedule; attrs num_parts i32, chunk_blocks i32
  jax_mla_decode_sparse(q, kv_cache, indices, topk_length, attn_sink)
      -> out, lse [, workspace u8 on CUDA]; attr softmax_scale f32 [, num_parts i32 on CUDA]
      (topk_length (0,) or (b,) s32, attn_sink (0,), (h_q,) or (b, h_q) f32). On CUDA the call runs
      as a dense decode over one-token pages on the SM90 or the portable kernel
      (cuda/runtime/sparse_launch.h), whose split-KV plan over the b * s_q query tokens sizes the
      workspace.

The handlers come from the extension module (`ext.registrations()`), registered once at import.
Lowering only emits a custom call by name, so the CUDA lowering is available on every machine
(e.g. to export for GPU from a CPU-only host) even when this build has no CUDA handler; compiling
it then needs a CUDA-enabled build.
"""

from __future__ import annotations

import jax
import jax.ffi
import numpy as np
from jax.interpreters import mlir

from . import _paged_write, _partitioning, _primitive, _validate
from ._extension import ext

DECODE_TARGET = "jax_mla_decode"
SCHEDULE_TARGET = "jax_mla_decode_schedule"
SPARSE_TARGET = "jax_mla_decode_sparse"
TARGETS = (DECODE_TARGET, SCHEDULE_TARGET, SPARSE_TARGET)

_registered = False


def _register_targets() -> None:
    global _registered
    if _registered:
        return
    for platform, targets in ext.registrations().items():
        for name, handler in targets.items():
            # `handler` is a capsule, or a dict of capsules keyed by FFI stage (e.g. the CUDA
            # decode target's "initialize" and "execute").
            jax.ffi.register_ffi_target(name, handler, platform=platform, api_version=1)
    _registered = True


def registered_platforms() -> tuple[str, ...]:
    """XLA platforms this build has handlers for ("cpu", and "CUDA" when built with CUDA)."""
    return tuple(ext.registrations().keys())


_decode_ffi = jax.ffi.ffi_lowering(DECODE_TARGET)
_schedule_ffi = jax.ffi.ffi_lowering(SCHEDULE_TARGET)
_sparse_ffi = jax.ffi.ffi_lowering(SPARSE_TARGET)


def _sparse_lowering_cpu(ctx, q, kv_cache, indices, topk_length, attn_sink, *, softmax_scale, chunk_blocks=0):
    # The CPU kernel never splits a query token's slots: its bits never depend on the batch, so
    # chunk_blocks (batch_invariant) has nothing to change there and is not passed.
    del chunk_blocks
    return _sparse_ffi(ctx, q, kv_cache, indices, topk_length, attn_sink,
                       softmax_scale=np.float32(softmax_scale))


def _sparse_lowering_cuda(ctx, q, kv_cache, indices, topk_length, attn_sink, *, softmax_scale, chunk_blocks=0):
    # The handler runs the call as a dense decode of b * s_q one-token requests of h_q rows
    # (cuda/runtime/sparse_launch.h), planned in the op with mla_decode's default num_parts for
    # h_q rows; its scratch is an extra result, dropped as for mla_decode.
    from ._api import default_num_parts  # _api imports this module

    dims = _validate.check_sparse_operands(*ctx.avals_in, primitive=True)
    _validate.check_gpu_sparse(dims)
    num_parts = default_num_parts(1, dims.heads_q)
    # batch_invariant (chunk_blocks > 0): S chunks per query token at most, as the handler plans it.
    max_chunks = int(ext.invariant_max_chunks(num_parts, chunk_blocks, dims.topk)) if chunk_blocks else 0
    nbytes = int(ext.sparse_workspace_bytes(dims.batch * dims.seq_q, dims.heads_q, dims.topk, num_parts,
                                            max_chunks))
    workspace = jax.core.ShapedArray((nbytes,), np.uint8)
    ctx_ws = ctx.replace(avals_out=[*ctx.avals_out, workspace])
    results = _sparse_ffi(ctx_ws, q, kv_cache, indices, topk_length, attn_sink,
                          softmax_scale=np.float32(softmax_scale), num_parts=np.int32(num_parts),
                          chunk_blocks=np.int32(chunk_blocks))
    return list(results)[:2]


def _decode_attrs(softmax_scale, causal, num_parts, kernel, chunk_blocks):
    # Python floats become f64 attributes: the handlers decode Attr<float>, so pass float32.
    return dict(softmax_scale=np.float32(softmax_scale), causal=bool(causal),
                num_parts=np.int32(num_parts), kernel=np.int32(_validate.KERNELS[kernel]),
                chunk_blocks=np.int32(chunk_blocks))


def _decode_lowering_cpu(ctx, q, kv_cache, block_table, seq_lens, schedule, *, softmax_scale,
                         causal, num_parts, kernel, chunk_blocks=0):
    return _decode_ffi(ctx, q, kv_cache, block_table, seq_lens, schedule,
                       **_decode_attrs(softmax_scale, causal, num_parts, kernel, chunk_blocks))


def workspace_bytes(b, rows, num_parts, chunk_blocks, max_pages, page_size, schedule_given):
    """Bytes of the CUDA workspace of one jax_mla_decode call: the handler computes the same."""
    max_chunks = 0
    if chunk_blocks:
        # The batch-invariant plan's partial slots: S per request (scheduler.h invariant_max_chunks),
        # bounded by the block table's capacity only when the op plans itself.
        capacity = -1 if schedule_given else max_pages * page_size
        max_chunks = int(ext.invariant_max_chunks(num_parts, chunk_blocks, capacity))
    return int(ext.workspace_bytes(b, rows, num_parts, max_chunks))


def _decode_lowering_cuda(ctx, q, kv_cache, block_table, seq_lens, schedule, *, softmax_scale,
                          causal, num_parts, kernel, chunk_blocks=0):
    # The CUDA handler receives its scratch memory (schedule, partial O and LSE) as an extra
    # result, so that it allocates nothing at run time (CUDA-graph safe). The primitive does not
    # expose it: lower with one more result and drop it.
    b, s_q, h_q, _ = ctx.avals_in[0].shape
    num_pages, page_size = ctx.avals_in[1].shape[:2]
    max_pages = ctx.avals_in[2].shape[1]
    _validate.check_gpu_page_size(page_size)
    _validate.check_gpu_kv_format(kernel, _validate.is_fp8_cache(ctx.avals_in[1]))
    nbytes = workspace_bytes(b, s_q * h_q, num_parts, chunk_blocks, max_pages, page_size,
                             schedule_given=ctx.avals_in[4].shape[0] != 0)
    workspace = jax.core.ShapedArray((nbytes,), np.uint8)
    ctx_ws = ctx.replace(avals_out=[*ctx.avals_out, workspace])
    results = _decode_ffi(ctx_ws, q, kv_cache, block_table, seq_lens, schedule,
                          **_decode_attrs(softmax_scale, causal, num_parts, kernel, chunk_blocks))
    return list(results)[:2]


def _schedule_lowering(ctx, seq_lens, *, num_parts, chunk_blocks=0):
    return _schedule_ffi(ctx, seq_lens, num_parts=np.int32(num_parts), chunk_blocks=np.int32(chunk_blocks))


def _auto_partitioned_decode(direct):
    # Multi-device computations partitioned by XLA get mla_decode's rule (_partitioning.py).
    return _partitioning.lowering(direct, _partitioning.decode, params=_DECODE_PARAMS,
                                  defaults=dict(chunk_blocks=0), multiple_results=True,
                                  export_direct=False, op="mla_decode")


def _auto_partitioned_sparse(direct):
    # Multi-device computations partitioned by XLA get mla_decode_sparse's rule (_partitioning.py).
    return _partitioning.lowering(direct, _partitioning.decode_sparse,
                                  params=("softmax_scale", "chunk_blocks"),
                                  defaults=dict(chunk_blocks=0), multiple_results=True,
                                  export_direct=False, op="mla_decode_sparse")


_DECODE_PARAMS = ("softmax_scale", "causal", "num_parts", "kernel", "chunk_blocks")

# update_kv_cache's write is plain jax; exported, it stays the plain scatter (XLA's own scatter
# partitioning, no Python callback).
_cache_update_lowering = _partitioning.lowering(
    mlir.lower_fun(_paged_write.write, multiple_results=False), _partitioning.cache_update,
    multiple_results=False, export_direct=True)

_register_targets()
mlir.register_lowering(_primitive.mla_decode_p, _auto_partitioned_decode(_decode_lowering_cpu),
                       platform="cpu")
mlir.register_lowering(_primitive.mla_decode_p, _auto_partitioned_decode(_decode_lowering_cuda),
                       platform="cuda")
mlir.register_lowering(_primitive.mla_decode_sparse_p, _auto_partitioned_sparse(_sparse_lowering_cpu),
                       platform="cpu")
mlir.register_lowering(_primitive.mla_decode_sparse_p, _auto_partitioned_sparse(_sparse_lowering_cuda),
                       platform="cuda")
mlir.register_lowering(_primitive.mla_decode_schedule_p, _schedule_lowering, platform="cpu")
mlir.register_lowering(_primitive.mla_decode_schedule_p, _schedule_lowering, platform="cuda")
mlir.register_lowering(_primitive.kv_cache_update_p, _cache_update_lowering)
