"""Public entry point mla_decode_sparse (DeepSeek-V3.2 sparse attention decode) and its
Explicit-axes sharding plan. CPU: its own kernel; CUDA: a decode kernel (SM90 or SM100 for an FP8
cache, whose producer warp gathers the rows, or the portable one) over a view of the cache as
one-token pages (docs/design.md, "Sparse decode")."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from . import _lowering, _sharding, _validate  # noqa: F401 (_lowering registers the FFI targets)
from ._primitive import mla_decode_sparse_p


def _as_array(x: Any) -> Any:
    return x if hasattr(x, "shape") and hasattr(x, "dtype") else np.asarray(x)


def mla_decode_sparse(q, kv_cache, indices, *, topk_length=None, softmax_scale=None, attn_sink=None,
                      return_lse=False, batch_invariant=False, invariant_chunk=None):
    """MLA decode over each query token's selected cache slots (DeepSeek-V3.2 sparse attention).

    Args:
      q: (b, s_q, h_q, 576) bfloat16 or float16; 1 <= s_q <= 8, 1 <= h_q <= 128.
      kv_cache: (num_pages, page_size, 576) or (num_pages, page_size, 1, 576) of q's dtype, or the
        FP8 cache: uint8 rows of 656 bytes (pack_fp8_kv), read as unpack_fp8_kv(kv_cache).
      indices: (b, s_q, topk) int32: flat token slots page_id * page_size + row. -1 = no token
        (skipped). Query token t of request r attends to kv_cache rows indices[r, t, :n]; a slot
        listed twice counts twice (as a gather would). Any other index outside
        [0, num_pages * page_size) is an error: a ValueError at call time for concrete inputs;
        under jit the CPU kernel fails the computation (naming request, token and position) and
        a GPU writes NaN into out and lse of that query token (all its heads), never reading
        out of bounds. Slots not selected are never read (NaN there cannot reach the result).
      topk_length: optional (b,) int32: only the first topk_length[r] indices of request r count,
        for all of its s_q tokens. Concrete values outside [0, topk] are a ValueError; traced ones
        are clamped to [0, topk] by the kernel.
      softmax_scale: static number multiplying q . k; default 576 ** -0.5.
      attn_sink: optional (h_q,) float32: out is multiplied by exp(lse) / (exp(lse) +
        exp(attn_sink[h])) (a sink logit that takes probability mass); lse is unchanged. -inf = no
        effect.
      return_lse: also return lse.
      batch_invariant, invariant_chunk: static, as mla_decode's: with True a query token's out and
        lse are bitwise the same whatever else is in the call (batch size, other requests, its
        position), on the same kernel, GPU architecture and static arguments. On CUDA each query
        token is one request of the split-KV plan, cut into chunks of invariant_chunk selected
        slots (default 1024); the CPU kernel never splits a token's slots, so its bits never
        depend on the batch and the flag changes nothing there.

    Returns:
      out (b, s_q, h_q, 512) in q's dtype, and with return_lse lse (b, s_q, h_q) float32 (natural
      log-sum-exp of the scaled scores of the counted slots). A row with no valid index gets out = 0
      and lse = -inf.

    On CUDA any page size works; b * s_q <= MAX_GPU_BATCH (16384). For an FP8 cache the kernel
    is the one mla_decode(..., kernel="auto") picks for that format where that is sm90 or sm100
    (JAX_MLA_KERNEL and the self-check included), else portable (which must then read the format:
    jax_mla._ext.FP8_KERNELS); a 16-bit cache runs on portable.

    jit, vmap and jax.export work as for mla_decode; there is no gradient (use
    jax_mla.reference.mla_decode_sparse_reference). Sharding over Explicit mesh axes: q and indices
    (and topk_length) split on the batch, q and attn_sink on the heads; the cache is replicated
    (indices are global slots). Over Auto axes the same split is made when XLA compiles
    (a custom_partitioning rule; a multi-device export then needs Explicit axes or shard_map).
    """
    q, kv_cache, indices = map(_as_array, (q, kv_cache, indices))
    if topk_length is not None:
        topk_length = _as_array(topk_length)
    if attn_sink is not None:
        attn_sink = _as_array(attn_sink)
    where = "mla_decode_sparse"
    dims = _validate.check_sparse_operands(q, kv_cache, indices, topk_length, attn_sink, where)
    scale = _validate.check_softmax_scale(
        _validate.HEAD_DIM_QK ** -0.5 if softmax_scale is None else softmax_scale, where)
    return_lse = _validate.check_bool("return_lse", return_lse, where)
    chunk_blocks = _validate.check_batch_invariant(batch_invariant, invariant_chunk, where)
    _validate.check_concrete_sparse(indices, topk_length, dims, where)

    def call(q, kv_cache, indices, topk_length, attn_sink):
        if kv_cache.ndim == 4:
            kv_cache = kv_cache.reshape(kv_cache.shape[0], kv_cache.shape[1], kv_cache.shape[3])
        tl = jnp.zeros((0,), jnp.int32) if topk_length is None else topk_length
        sink = jnp.zeros((0,), jnp.float32) if attn_sink is None else attn_sink
        return mla_decode_sparse_p.bind(q, kv_cache, indices, tl, sink, softmax_scale=scale,
                                        chunk_blocks=chunk_blocks)

    args = [jnp.asarray(x) for x in (q, kv_cache, indices)]
    opt = [None if x is None else jnp.asarray(x) for x in (topk_length, attn_sink)]
    plan = _plan(q, kv_cache, indices, topk_length, attn_sink)
    if plan is None:
        out, lse = call(*args, *opt)
    else:
        out, lse = _sharded_call(plan, call, *args, *opt)
    return (out, lse) if return_lse else out


def _plan(*operands):
    """The split over Explicit mesh axes (q's batch and head axes), None when no operand is
    sharded over Explicit axes. When only other operands are, everything is gathered (one call
    per device on replicated operands)."""
    found = [_sharding._explicit_sharding(x) for x in operands if x is not None]
    meshes = [f[0] for f in found if f is not None]
    if not meshes:
        return None
    mesh = meshes[0]
    q_found = found[0]
    entries = q_found[1] if q_found is not None and q_found[0] == mesh else [()] * 4
    return _sharding.Plan(mesh, entries[0], entries[2], False)


def _sharded_call(p, body, q, kv_cache, indices, topk_length, attn_sink):
    """One kernel call per shard: batch axes split q, indices and topk_length; head axes split q
    and attn_sink; the cache is replicated (indices address the whole cache)."""
    B, H = p.batch_entry, p.head_entry
    specs = [P(B, None, H, None), P(), P(B, None, None)]
    args = [q, kv_cache, indices]
    has_len, has_sink = topk_length is not None, attn_sink is not None
    if has_len:
        specs.append(P(B))
        args.append(topk_length)
    if has_sink:
        specs.append(P(H))
        args.append(attn_sink)
    args = [_sharding.conform(x, p.mesh, s) for x, s in zip(args, specs)]

    def per_shard(q, kv_cache, indices, *rest):
        rest = list(rest)
        tl = rest.pop(0) if has_len else None
        sink = rest.pop(0) if has_sink else None
        return tuple(body(q, kv_cache, indices, tl, sink))

    out_specs = (P(B, None, H, None), P(B, None, H))
    # Under jit even when eager, as _sharding.sharded_call (its comment says why).
    return jax.jit(jax.shard_map(per_shard, mesh=p.mesh, in_specs=tuple(specs), out_specs=out_specs,
                                 axis_names=set(p.mesh.explicit_axes)))(*args)
