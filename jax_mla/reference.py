"""Plain jax.numpy MLA decode: the semantics of docs/design.md, for tests and as a fallback.

Runs anywhere JAX does (and is differentiable), at the cost of gathering every request's pages
into a dense cache. Accumulates in float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from . import _fp8, _validate


def mla_decode_reference(q, kv_cache, block_table, seq_lens, *, softmax_scale=None, causal=False,
                         out_dtype=None):
    """Reference MLA decode. Same arguments and semantics as jax_mla.mla_decode.

    Args:
      q: (b, s_q, h_q, 576); kv_cache: (num_pages, page_size, 576) or (num_pages, page_size, 1,
        576), or uint8 FP8 rows (..., 656) from pack_fp8_kv, read as unpack_fp8_kv(kv_cache) in
        float32; block_table: (b, max_pages) int32; seq_lens: (b,) int32.
      softmax_scale: multiplies q . k; default 576 ** -0.5.
      causal: query token t sees cache positions < seq_len - s_q + t + 1.
      out_dtype: dtype of out; q's dtype by default (float32 keeps the unrounded result).

    Returns:
      (out (b, s_q, h_q, 512), lse (b, s_q, h_q) float32). A row with no visible key has out = 0
      and lse = -inf. Cache rows that no request may see never reach the result, even when they
      hold NaN or inf, and block table entries past a request's pages are never used.
    """
    q = jnp.asarray(q)
    kv_cache = jnp.asarray(kv_cache)
    if kv_cache.ndim == 4:
        kv_cache = kv_cache.reshape(kv_cache.shape[0], kv_cache.shape[1], kv_cache.shape[3])
    block_table = jnp.asarray(block_table)
    seq_lens = jnp.asarray(seq_lens)
    scale = _validate.HEAD_DIM_QK ** -0.5 if softmax_scale is None else softmax_scale
    out_dtype = q.dtype if out_dtype is None else out_dtype

    b, s_q, h_q, _ = q.shape
    num_pages, page_size, _ = kv_cache.shape
    max_pages = block_table.shape[1]
    num_keys = max_pages * page_size

    # Dense per-request cache (b, max_pages * page_size, 576). Entries past a request's pages may
    # be anything, so clamp them to a valid id and mask the gathered rows below.
    pages = jnp.clip(block_table, 0, num_pages - 1)
    keys = kv_cache[pages].reshape(b, num_keys, kv_cache.shape[-1])
    if _validate.is_fp8_cache(kv_cache):
        # FP8 rows dequantized exactly to float32; garbage in unused rows is masked below.
        keys = _fp8.unpack_fp8_kv(keys, jnp.float32)
    keys = keys.astype(jnp.float32)
    pos = jnp.arange(num_keys)
    in_cache = pos[None, :] < seq_lens[:, None]                        # (b, T)
    keys = jnp.where(in_cache[:, :, None], keys, 0.0)                  # no NaN from unused rows

    # Visible keys per query token: t sits at position seq_len - s_q + t.
    t = jnp.arange(s_q)
    if causal:
        limit = jnp.maximum(seq_lens[:, None] - s_q + t[None, :] + 1, 0)  # (b, s_q)
    else:
        limit = jnp.broadcast_to(seq_lens[:, None], (b, s_q))
    visible = pos[None, None, :] < limit[:, :, None]                  # (b, s_q, T)

    qf = q.astype(jnp.float32)
    hi = jax.lax.Precision.HIGHEST
    scores = jnp.einsum("bthd,bkd->bthk", qf, keys, precision=hi) * jnp.float32(scale)
    scores = jnp.where(visible[:, :, None, :], scores, -jnp.inf)      # (b, s_q, h_q, T)
    m = jnp.max(scores, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    p = jnp.where(visible[:, :, None, :], jnp.exp(scores - m), 0.0)
    denom = jnp.sum(p, axis=-1)                                        # (b, s_q, h_q)
    acc = jnp.einsum("bthk,bkd->bthd", p, keys[:, :, :_validate.HEAD_DIM_V], precision=hi)
    has_keys = denom > 0
    out = jnp.where(has_keys[..., None], acc / jnp.where(has_keys, denom, 1.0)[..., None], 0.0)
    lse = jnp.where(has_keys, m[..., 0] + jnp.log(jnp.where(has_keys, denom, 1.0)), -jnp.inf)
    return out.astype(out_dtype), lse.astype(jnp.float32)


def mla_decode_sparse_reference(q, kv_cache, indices, *, topk_length=None, softmax_scale=None,
                                attn_sink=None, out_dtype=None):
    """Reference sparse MLA decode: same arguments and semantics as jax_mla.mla_decode_sparse
    (out_dtype as mla_decode_reference's). Gathers the selected rows (an FP8 cache through
    unpack_fp8_kv in float32); -1, indices past topk_length and any other out-of-range index are
    masked out (no error here). Differentiable in q, a 16-bit cache and attn_sink.

    Returns (out (b, s_q, h_q, 512), lse (b, s_q, h_q) float32).
    """
    q = jnp.asarray(q)
    kv_cache = jnp.asarray(kv_cache)
    if kv_cache.ndim == 4:
        kv_cache = kv_cache.reshape(kv_cache.shape[0], kv_cache.shape[1], kv_cache.shape[3])
    indices = jnp.asarray(indices)
    scale = _validate.HEAD_DIM_QK ** -0.5 if softmax_scale is None else softmax_scale
    out_dtype = q.dtype if out_dtype is None else out_dtype
    b, s_q, h_q, _ = q.shape
    topk = indices.shape[-1]
    rows = kv_cache.reshape(-1, kv_cache.shape[-1])                    # (slots, 576 | 656)
    num_slots = rows.shape[0]
    counted = indices >= 0
    counted &= indices < num_slots
    if topk_length is not None:
        counted &= jnp.arange(topk)[None, None, :] < jnp.asarray(topk_length)[:, None, None]
    keys = rows[jnp.where(counted, indices, 0)]                        # (b, s_q, topk, .)
    if _validate.is_fp8_cache(kv_cache):
        keys = _fp8.unpack_fp8_kv(keys, jnp.float32)
    keys = jnp.where(counted[..., None], keys.astype(jnp.float32), 0.0)  # no NaN from slot 0
    hi = jax.lax.Precision.HIGHEST
    scores = jnp.einsum("bthd,btkd->bthk", q.astype(jnp.float32), keys, precision=hi) * jnp.float32(scale)
    mask = counted[:, :, None, :]
    scores = jnp.where(mask, scores, -jnp.inf)
    m = jnp.max(scores, axis=-1, keepdims=True)
    m = jax.lax.stop_gradient(jnp.where(jnp.isfinite(m), m, 0.0))
    p = jnp.where(mask, jnp.exp(scores - m), 0.0)
    denom = jnp.sum(p, axis=-1)
    acc = jnp.einsum("bthk,btkd->bthd", p, keys[..., :_validate.HEAD_DIM_V], precision=hi)
    has = denom > 0
    safe = jnp.where(has, denom, 1.0)
    out = jnp.where(has[..., None], acc / safe[..., None], 0.0)
    lse = jnp.where(has, m[..., 0] + jnp.log(safe), -jnp.inf)
    if attn_sink is not None:
        sink = jnp.asarray(attn_sink, jnp.float32)
        factor = jnp.where(has, 1.0 / (1.0 + jnp.exp(sink - jnp.where(has, lse, 0.0))), 0.0)
        out = out * factor[..., None]
    return out.astype(out_dtype), lse.astype(jnp.float32)
