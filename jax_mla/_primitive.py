"""The two JAX primitives of jax_mla and their platform-independent rules.

mla_decode_p(q, kv_cache, block_table, seq_lens, schedule; softmax_scale, causal, num_parts, kernel,
             chunk_blocks) -> (out, lse)
  q (b, s_q, h_q, 576) bf16|f16, kv_cache (P, page, 576) same dtype or (P, page, 656) uint8 (FP8
  rows, jax_mla._fp8: the dtype is the format), block_table (b, M) int32,
  seq_lens (b,) int32, schedule int32 of shape (0,) [computed in the op] or
  (schedule_size(b, num_parts, chunk_blocks > 0),) [from mla_decode_schedule_p]. Params are static
  Python values; kernel is "auto", "sm90", "sm100" or "portable" (which CUDA kernel; the CPU
  lowering ignores it); chunk_blocks is 0 (the default split-KV plans) or the batch-invariant plan's
  chunk in 64-token blocks (optional, default 0).
  out (b, s_q, h_q, 512) q's dtype, lse (b, s_q, h_q) float32.

mla_decode_schedule_p(seq_lens; num_parts, chunk_blocks) -> schedule
  (schedule_size(b, num_parts, chunk_blocks > 0),) int32.

mla_decode_sparse_p(q, kv_cache, indices, topk_length, attn_sink; softmax_scale, chunk_blocks) -> (out, lse)
  q as mla_decode_p's, kv_cache (P, page, 576) q's dtype or (P, page, 656) uint8, indices
  (b, s_q, topk) int32 flat slots page_id * page_size + row (-1: none), topk_length (0,) [absent]
  or (b,) int32, attn_sink (0,) [absent], (h_q,) or (b, h_q) [per request, from vmap] float32.

kv_cache_update_p(kv_cache, new_latent, block_table, positions) -> kv_cache updated
  update_kv_cache's write (_paged_write.write, plain jax). It is a primitive only so that its
  lowering can give XLA a partitioning rule for it (_partitioning.py); vmap and differentiation
  go through the plain jax function.

Rules here: abstract evaluation (shape/dtype checks from _validate), eager implementation,
batching (vmap) and the gradient rules. Lowerings live in _lowering.py.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, xla

from . import _paged_write, _validate

mla_decode_p = Primitive("mla_decode")
mla_decode_p.multiple_results = True

mla_decode_schedule_p = Primitive("mla_decode_schedule")

kv_cache_update_p = Primitive("kv_cache_update")

mla_decode_sparse_p = Primitive("mla_decode_sparse")
mla_decode_sparse_p.multiple_results = True


# ----------------------------------------------------------------------------------------------
# Abstract evaluation
# ----------------------------------------------------------------------------------------------


def _decode_abstract_eval(q, kv_cache, block_table, seq_lens, schedule, *, softmax_scale, causal,
                          num_parts, kernel, chunk_blocks=0):
    dims = _validate.check_decode_operands(q, kv_cache, block_table, seq_lens)
    if len(kv_cache.shape) != 3:
        raise ValueError(
            f"mla_decode: the primitive takes kv_cache of rank 3 (num_pages, page_size, "
            f"{kv_cache.shape[-1]}), got shape {tuple(kv_cache.shape)}")
    _validate.check_softmax_scale(softmax_scale)
    _validate.check_bool("causal", causal)
    _validate.check_kernel(kernel)
    _validate.check_num_parts(num_parts, dims.batch, where="mla_decode")
    _validate.check_chunk_blocks(chunk_blocks, where="mla_decode")
    _validate.check_schedule_operand(schedule, dims.batch, num_parts, where="mla_decode",
                                     chunk_blocks=chunk_blocks)
    b, s_q, h_q = dims.batch, dims.seq_q, dims.heads_q
    return (jax.core.ShapedArray((b, s_q, h_q, _validate.HEAD_DIM_V), q.dtype),
            jax.core.ShapedArray((b, s_q, h_q), np.float32))


def _schedule_abstract_eval(seq_lens, *, num_parts, chunk_blocks=0):
    b = _validate.check_seq_lens_only(seq_lens)
    _validate.check_num_parts(num_parts, b)
    chunk_blocks = _validate.check_chunk_blocks(chunk_blocks, where="decode_schedule")
    return jax.core.ShapedArray((_validate.schedule_size(b, num_parts, chunk_blocks > 0),), np.int32)


def _cache_update_abstract_eval(kv_cache, new_latent, block_table, positions):
    _validate.check_cache_update_operands(kv_cache, new_latent, block_table, positions)
    return jax.core.ShapedArray(kv_cache.shape, kv_cache.dtype)


def _sparse_abstract_eval(q, kv_cache, indices, topk_length, attn_sink, *, softmax_scale, chunk_blocks=0):
    dims = _validate.check_sparse_operands(q, kv_cache, indices, topk_length, attn_sink, primitive=True)
    if len(kv_cache.shape) != 3:
        raise ValueError(
            f"mla_decode_sparse: the primitive takes kv_cache of rank 3, got shape {tuple(kv_cache.shape)}")
    _validate.check_softmax_scale(softmax_scale, where="mla_decode_sparse")
    _validate.check_chunk_blocks(chunk_blocks, where="mla_decode_sparse")
    b, s_q, h_q = dims.batch, dims.seq_q, dims.heads_q
    return (jax.core.ShapedArray((b, s_q, h_q, _validate.HEAD_DIM_V), q.dtype),
            jax.core.ShapedArray((b, s_q, h_q), np.float32))


mla_decode_p.def_abstract_eval(_decode_abstract_eval)
mla_decode_sparse_p.def_abstract_eval(_sparse_abstract_eval)
mla_decode_schedule_p.def_abstract_eval(_schedule_abstract_eval)
kv_cache_update_p.def_abstract_eval(_cache_update_abstract_eval)

# Eager calls compile the primitive alone (cached per shapes and params), like jax's own ops.
mla_decode_p.def_impl(lambda *args, **params: xla.apply_primitive(mla_decode_p, *args, **params))
mla_decode_sparse_p.def_impl(
    lambda *args, **params: xla.apply_primitive(mla_decode_sparse_p, *args, **params))
mla_decode_schedule_p.def_impl(
    lambda *args, **params: xla.apply_primitive(mla_decode_schedule_p, *args, **params))
kv_cache_update_p.def_impl(
    lambda *args, **params: xla.apply_primitive(kv_cache_update_p, *args, **params))


# ----------------------------------------------------------------------------------------------
# Batching (vmap): fold the vmapped axis into the batch of requests
# ----------------------------------------------------------------------------------------------


def _to_front(x, bdim, size):
    """x with its batch axis first; unbatched operands are broadcast to `size` copies."""
    if bdim is None:
        return jnp.broadcast_to(x, (size,) + tuple(x.shape))
    return jnp.moveaxis(x, bdim, 0)


def _decode_batch(args, bdims, *, softmax_scale, causal, num_parts, kernel, chunk_blocks=0):
    q, kv_cache, block_table, seq_lens, _schedule = args
    q_d, kv_d, bt_d, sl_d, _ = bdims
    size = next(x.shape[d] for x, d in zip(args, bdims) if d is not None)

    q = _to_front(q, q_d, size)                      # (V, b, s_q, h_q, 576)
    block_table = _to_front(block_table, bt_d, size)  # (V, b, M)
    seq_lens = _to_front(seq_lens, sl_d, size)        # (V, b)
    v, b = q.shape[0], q.shape[1]

    if kv_d is not None:
        # Each instance has its own cache: lay the V caches end to end as one cache of V*P pages
        # (rows of either format: only the page axis changes)
        # and point instance v's block table at its own pages (ids shifted by v*P). Ids outside
        # [0, P) stay invalid (-1) so the kernels still report them instead of reading a
        # neighbouring instance's pages.
        kv_cache = jnp.moveaxis(kv_cache, kv_d, 0)  # (V, P, page, 576 or 656)
        num_pages = kv_cache.shape[1]
        if v * num_pages > np.iinfo(np.int32).max:
            raise ValueError(
                f"mla_decode under vmap: {v} instances of a {num_pages}-page kv_cache exceed the "
                f"int32 page id range")
        shift = (jnp.arange(v, dtype=jnp.int32) * num_pages)[:, None, None]
        valid = (block_table >= 0) & (block_table < num_pages)
        block_table = jnp.where(valid, block_table + shift, jnp.int32(-1))
        kv_cache = kv_cache.reshape((v * num_pages,) + kv_cache.shape[2:])

    q = q.reshape((v * b,) + q.shape[2:])
    block_table = block_table.reshape((v * b, block_table.shape[-1]))
    seq_lens = seq_lens.reshape((v * b,))
    # A schedule describes one batch of b requests; the folded batch needs its own, so a passed
    # schedule is dropped and the op computes one (same num_parts and plan kind: a batch-invariant
    # call stays one, and its requests keep their bits in the folded batch).
    schedule = jnp.zeros((0,), jnp.int32)
    out, lse = mla_decode_p.bind(q, kv_cache, block_table, seq_lens, schedule,
                                 softmax_scale=softmax_scale, causal=causal, num_parts=num_parts,
                                 kernel=kernel, chunk_blocks=chunk_blocks)
    out = out.reshape((v, b) + out.shape[1:])
    lse = lse.reshape((v, b) + lse.shape[1:])
    return (out, lse), (0, 0)


def _sparse_batch(args, bdims, *, softmax_scale, chunk_blocks=0):
    q, kv_cache, indices, topk_length, attn_sink = args
    q_d, kv_d, idx_d, tl_d, sink_d = bdims
    size = next(x.shape[d] for x, d in zip(args, bdims) if d is not None)
    q = _to_front(q, q_d, size)              # (V, b, s_q, h_q, 576)
    indices = _to_front(indices, idx_d, size)  # (V, b, s_q, topk)
    v, b = q.shape[0], q.shape[1]
    if kv_d is not None:
        # V caches end to end as one of V * P pages; instance v's slots shift by v * P * page.
        # -1 stays -1 (no token); any other out-of-range index becomes -2, still out of range, so
        # the kernel reports it (with -2 as the index) instead of reading another instance's cache.
        kv_cache = jnp.moveaxis(kv_cache, kv_d, 0)
        slots = kv_cache.shape[1] * kv_cache.shape[2]
        if v * slots > np.iinfo(np.int32).max:
            raise ValueError(
                f"mla_decode_sparse under vmap: {v} instances of a {slots}-slot kv_cache exceed the "
                f"int32 slot range")
        shift = (jnp.arange(v, dtype=jnp.int32) * slots)[:, None, None, None]
        valid = (indices >= 0) & (indices < slots)
        indices = jnp.where(valid, indices + shift, jnp.where(indices == -1, -1, -2)).astype(jnp.int32)
        kv_cache = kv_cache.reshape((v * kv_cache.shape[1],) + kv_cache.shape[2:])
    has_len = topk_length.shape[-1] != 0
    if has_len:
        topk_length = _to_front(topk_length, tl_d, size).reshape((v * b,))
    else:
        topk_length = jnp.zeros((0,), jnp.int32)
    # A sink is per head: a batched one becomes the (V * b, h_q) per-request form.
    if attn_sink.shape[-1] == 0:
        attn_sink = jnp.zeros((0,), jnp.float32)
    elif sink_d is not None:
        sink = jnp.moveaxis(attn_sink, sink_d, 0)  # (V, h_q) or (V, b, h_q)
        if sink.ndim == 2:
            sink = jnp.broadcast_to(sink[:, None, :], (v, b, sink.shape[-1]))
        attn_sink = sink.reshape((v * b, sink.shape[-1]))
    elif attn_sink.ndim == 2:
        attn_sink = jnp.broadcast_to(attn_sink[None], (v,) + attn_sink.shape).reshape((v * b, -1))
    out, lse = mla_decode_sparse_p.bind(
        q.reshape((v * b,) + q.shape[2:]), kv_cache, indices.reshape((v * b,) + indices.shape[2:]),
        topk_length, attn_sink, softmax_scale=softmax_scale, chunk_blocks=chunk_blocks)
    out = out.reshape((v, b) + out.shape[1:])
    lse = lse.reshape((v, b) + lse.shape[1:])
    return (out, lse), (0, 0)


def _schedule_batch(args, bdims, *, num_parts, chunk_blocks=0):
    (seq_lens,), (bdim,) = args, bdims
    seq_lens = jnp.moveaxis(seq_lens, bdim, 0)  # (V, b)
    # Schedules of different instances are independent plans: compute them one after the other.
    out = jax.lax.map(
        lambda s: mla_decode_schedule_p.bind(s, num_parts=num_parts, chunk_blocks=chunk_blocks), seq_lens)
    return out, 0


def _cache_update_batch(args, bdims):
    return jax.vmap(_paged_write.write, in_axes=tuple(bdims))(*args), 0


batching.primitive_batchers[mla_decode_p] = _decode_batch
batching.primitive_batchers[mla_decode_schedule_p] = _schedule_batch
batching.primitive_batchers[mla_decode_sparse_p] = _sparse_batch
batching.primitive_batchers[kv_cache_update_p] = _cache_update_batch


# ----------------------------------------------------------------------------------------------
# Gradients: none for mla_decode; the cache update's are those of its plain jax write
# ----------------------------------------------------------------------------------------------

def _cache_update_jvp(primals, tangents):
    tangents = [ad.instantiate_zeros(t) for t in tangents]
    return jax.jvp(_paged_write.write, tuple(primals), tuple(tangents))


ad.primitive_jvps[kv_cache_update_p] = _cache_update_jvp


def _register_no_grad(primitive, name: str, reference: str) -> None:
    """JVP and transpose rules of an inference-only primitive: an error naming the differentiable
    plain-jnp reference."""
    message = (f"{name} is inference-only; it has no gradient (JVP/VJP) rule. Wrap its inputs in "
               f"jax.lax.stop_gradient if it sits inside a differentiated function, or use "
               f"jax_mla.reference.{reference}, which is plain jax.numpy and differentiable.")

    def no_grad(*args, **kwargs):
        raise NotImplementedError(message)

    ad.primitive_jvps[primitive] = no_grad
    ad.primitive_transposes[primitive] = no_grad


_register_no_grad(mla_decode_p, "mla_decode", "mla_decode_reference")
_register_no_grad(mla_decode_sparse_p, "mla_decode_sparse", "mla_decode_sparse_reference")
