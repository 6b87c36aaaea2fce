"""FFI target registration and per-platform lowering of the jax_mla primitives.

Targets and their buffer order are the contract of docs/design.md ("FFI targets"):

  jax_mla_decode(q, kv_cache, block_table, seq_lens, schedule)
      -> out, lse [, workspace u8 on CUDA]; attrs softmax_scale f32, causal bool, num_parts i32,
         kernel i32 (_validate.KERNELS; the CPU handler checks it and ignores it)
  jax_mla_decode_schedule(seq_lens) -> schedule; attrs num_parts i32

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

from . import _primitive, _validate
from ._extension import ext

DECODE_TARGET = "jax_mla_decode"
SCHEDULE_TARGET = "jax_mla_decode_schedule"
TARGETS = (DECODE_TARGET, SCHEDULE_TARGET)

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


def _decode_attrs(softmax_scale, causal, num_parts, kernel):
    # Python floats become f64 attributes: the handlers decode Attr<float>, so pass float32.
    return dict(softmax_scale=np.float32(softmax_scale), causal=bool(causal),
                num_parts=np.int32(num_parts), kernel=np.int32(_validate.KERNELS[kernel]))


def _decode_lowering_cpu(ctx, q, kv_cache, block_table, seq_lens, schedule, *, softmax_scale,
                         causal, num_parts, kernel):
    return _decode_ffi(ctx, q, kv_cache, block_table, seq_lens, schedule,
                       **_decode_attrs(softmax_scale, causal, num_parts, kernel))


def _decode_lowering_cuda(ctx, q, kv_cache, block_table, seq_lens, schedule, *, softmax_scale,
                          causal, num_parts, kernel):
    # The CUDA handler receives its scratch memory (schedule, partial O and LSE) as an extra
    # result, so that it allocates nothing at run time (CUDA-graph safe). The primitive does not
    # expose it: lower with one more result and drop it.
    b, s_q, h_q, _ = ctx.avals_in[0].shape
    _validate.check_gpu_page_size(ctx.avals_in[1].shape[1])
    _validate.check_gpu_kv_format(kernel, _validate.is_fp8_cache(ctx.avals_in[1]))
    workspace = jax.core.ShapedArray((int(ext.workspace_bytes(b, s_q * h_q, num_parts)),), np.uint8)
    ctx_ws = ctx.replace(avals_out=[*ctx.avals_out, workspace])
    results = _decode_ffi(ctx_ws, q, kv_cache, block_table, seq_lens, schedule,
                          **_decode_attrs(softmax_scale, causal, num_parts, kernel))
    return list(results)[:2]


def _schedule_lowering(ctx, seq_lens, *, num_parts):
    return _schedule_ffi(ctx, seq_lens, num_parts=np.int32(num_parts))


_register_targets()
mlir.register_lowering(_primitive.mla_decode_p, _decode_lowering_cpu, platform="cpu")
mlir.register_lowering(_primitive.mla_decode_p, _decode_lowering_cuda, platform="cuda")
mlir.register_lowering(_primitive.mla_decode_schedule_p, _schedule_lowering, platform="cpu")
mlir.register_lowering(_primitive.mla_decode_schedule_p, _schedule_lowering, platform="cuda")
