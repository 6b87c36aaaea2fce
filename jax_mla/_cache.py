"""update_kv_cache: write new tokens' latent rows into a paged cache (in place when donated)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
from jaxlib.version import __version__ as jaxlib_version

from . import _sharding, _validate
from ._api import _as_array
from ._fp8 import pack_fp8_kv


def update_kv_cache(kv_cache, new_latent, block_table, positions):
    """Writes new tokens' 576-wide latent rows into their pages of a paged KV cache.

    Token t of request r, at sequence position p = positions[r, t], goes to row p % page_size of
    page block_table[r, p // page_size] (the layout mla_decode reads). Pure jax: under
    jax.jit(..., donate_argnums=...) with the cache donated, the cache is updated in place (the
    compiled computation aliases it to the result and copies nothing); without donation XLA
    copies the cache first, as for any functional update.

    Args:
      kv_cache: (num_pages, page_size, 576) or (num_pages, page_size, 1, 576), bfloat16 or float16;
        or an FP8 cache, uint8 (num_pages, page_size, 656) or (num_pages, page_size, 1, 656).
      new_latent: (b, s_new, 576), kv_cache's dtype: per token the 512 compressed-KV values then
        the 64 RoPE'd key values (the same row mla_decode reads as key, its first 512 as value).
        For an FP8 cache bfloat16, float16 or float32, quantized exactly as pack_fp8_kv does
        (per-token scales: a written row depends on that token's values only).
      block_table: (b, max_pages) int32, as for mla_decode.
      positions: (b, s_new) int32 sequence positions; a negative position marks padding (that
        token is not written), so requests may add different numbers of tokens.

    Returns:
      The updated cache, same shape and dtype as kv_cache.

    No two written tokens may land on the same cache row. When positions and block_table are
    concrete this, positions < max_pages * page_size and valid page ids are checked at call time
    (ValueError); under jit a token whose position or page id is out of range is not written.

    Sharding (Explicit mesh axes, as mla_decode): with new_latent, block_table and positions split
    over the batch and kv_cache's pages over the same axes, each shard writes its own pages with
    no collective (page ids are global; a write to another shard's page is dropped). Other
    layouts are left to XLA's scatter partitioning.
    """
    kv_cache, new_latent, block_table, positions = map(
        _as_array, (kv_cache, new_latent, block_table, positions))
    dims = _validate.check_cache_update_operands(kv_cache, new_latent, block_table, positions)
    _validate.check_concrete_positions(positions, block_table, dims)
    args = [jnp.asarray(x) for x in (kv_cache, new_latent, block_table, positions)]
    plan = _sharding.cache_plan(kv_cache, new_latent)
    if plan is None:
        return _write(*args)
    _sharding.check_concrete_write_placement(plan, block_table, positions, dims.num_pages,
                                             dims.page_size)
    B = plan.batch_entry

    def per_shard(kv, rows, table, pos):
        local_pages = kv.shape[0]
        base = jax.lax.axis_index(B) * local_pages
        own = (table >= base) & (table < base + local_pages)
        return _write(kv, rows, jnp.where(own, table - base, jnp.int32(-1)), pos)

    return jax.shard_map(per_shard, mesh=plan.mesh, in_specs=(P(B),) * 4, out_specs=P(B),
                         axis_names=set(plan.mesh.explicit_axes))(*args)


def _write(kv_cache, new_latent, block_table, positions):
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
