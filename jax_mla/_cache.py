"""update_kv_cache: write new tokens' latent rows into a paged cache (in place when donated)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from . import _sharding, _validate
from ._api import _as_array
from ._paged_write import write
from ._primitive import kv_cache_update_p


def update_kv_cache(kv_cache, new_latent, block_table, positions):
    """Writes new tokens' 576-wide latent rows into their pages of a paged KV cache.

    Token t of request r, at sequence position p = positions[r, t], goes to row p % page_size of
    page block_table[r, p // page_size] (the layout mla_decode reads). A plain jax scatter: under
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

    Sharding (Explicit or Auto mesh axes, as mla_decode): the cache keeps its page-axis split and
    no collective runs when new_latent, block_table and positions are either split over the same
    axes as the cache's pages (each shard writes its requests into its own pages; page ids are
    global, a write to another shard's page is dropped) or replicated (each shard writes the
    tokens landing on its pages). Other layouts are resharded first. An export over several
    devices with Auto axes keeps the plain scatter, which XLA partitions by its own scatter rule
    (gathering the new rows, never the cache; every write lands on its page).
    """
    kv_cache, new_latent, block_table, positions = map(
        _as_array, (kv_cache, new_latent, block_table, positions))
    dims = _validate.check_cache_update_operands(kv_cache, new_latent, block_table, positions)
    _validate.check_concrete_positions(positions, block_table, dims)
    args = [jnp.asarray(x) for x in (kv_cache, new_latent, block_table, positions)]
    plan = _sharding.cache_plan(kv_cache, new_latent, block_table, positions)
    if plan is None:
        return kv_cache_update_p.bind(*args)
    if plan.rows_split:
        _sharding.check_concrete_write_placement(plan.shard_plan(), block_table, positions,
                                                 dims.num_pages, dims.page_size)
    A = _sharding._entry(plan.page_axes)
    R = A if plan.rows_split else None
    in_specs = (P(A), P(R), P(R), P(R))
    args = [_sharding.conform(x, plan.mesh, s) for x, s in zip(args, in_specs)]

    def per_shard(kv, rows, table, pos):
        if plan.page_axes:
            table = _sharding.local_page_ids(table, A, kv.shape[0])
        return write(kv, rows, table, pos)

    return jax.shard_map(per_shard, mesh=plan.mesh, in_specs=in_specs, out_specs=P(A),
                         axis_names=set(plan.mesh.explicit_axes))(*args)
