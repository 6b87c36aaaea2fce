"""The paged-cache write of update_kv_cache in plain jax, on the whole arrays or on one shard's.

Token t of request r, at position p = positions[r, t], goes to row p % page_size of page
block_table[r, p // page_size]; a token whose position or page id is out of range (negative
positions included) is not written. A uint8 (FP8) cache gets the rows packed by pack_fp8_kv
(656 bytes each, quantized per token), scattered like 576 values.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxlib.version import __version__ as jaxlib_version

from ._fp8 import pack_fp8_kv


def write(kv_cache, new_latent, block_table, positions):
    """The update on one shard's (or the whole) arrays; invalid entries are not written. A uint8
    (FP8) cache gets the packed rows: 656 bytes scattered like 576 values."""
    num_pages, page_size = kv_cache.shape[0], kv_cache.shape[1]
    row_shape = kv_cache.shape[2:]  # (576,) or (1, 576): no reshape of the cache (XLA copies it)
    max_pages = block_table.shape[1]
    n = positions.size
    pos = positions.reshape(n)
    if kv_cache.dtype == jnp.uint8:
        new_latent = pack_fp8_kv(new_latent)  # (b, s_new, 656): only the new rows are quantized
    rows = new_latent.reshape((n,) + row_shape)
    col = pos // page_size
    req = jnp.repeat(jnp.arange(block_table.shape[0], dtype=jnp.int32), positions.shape[1])
    page = block_table[req, jnp.clip(col, 0, max_pages - 1)]
    valid = (pos >= 0) & (col < max_pages) & (page >= 0) & (page < num_pages)
    slot = jnp.where(valid, pos % page_size, 0)
    if kv_cache.dtype == jnp.bfloat16 and _CPU_UPCASTS_BF16_SCATTER:
        return jax.lax.platform_dependent(kv_cache, rows, page, slot, valid,
                                          cpu=_scatter_as_uint16, default=_scatter)
    return _scatter(kv_cache, rows, page, slot, valid)


# XLA's CPU backend in jaxlib 0.10 (and, untested, 0.11) has no bfloat16 scatter: it converts the
# whole cache to float32 and back (two cache-sized temporaries, NaN payloads canonicalised). There
# the bits are scattered as uint16 instead: exact, at the cost of one copy of the cache per call.
# jaxlib 0.12's CPU backend scatters bfloat16 in place.
_CPU_UPCASTS_BF16_SCATTER = tuple(int(v) for v in jaxlib_version.split(".")[:2]) < (0, 12)


def _scatter(kv, rows, page, slot, valid):
    num_pages = kv.shape[0]
    # Dropped entries get distinct out-of-range page ids, so the indices stay unique.
    page = jnp.where(valid, page, num_pages + jnp.arange(page.shape[0], dtype=jnp.int32))
    return kv.at[page, slot].set(rows, mode="drop", unique_indices=True)


def _scatter_as_uint16(kv, rows, page, slot, valid):
    bits = _scatter(jax.lax.bitcast_convert_type(kv, jnp.uint16),
                    jax.lax.bitcast_convert_type(rows, jnp.uint16), page, slot, valid)
    return jax.lax.bitcast_convert_type(bits, kv.dtype)
