"""mla_decode and update_kv_cache on inputs sharded over Explicit mesh axes: a shard_map over
the batch and head axes, planned at trace time from the inputs' shardings.

Explicit axes (jax.make_mesh's default axis type) are visible at trace time
(`jax.typeof(x).sharding`), so the split is decided in Python and the call becomes a shard_map:
it keeps the op's global semantics, needs no partitioner and exports with jax.export. Auto axes
are not visible at trace time; for them _partitioning.py gives XLA the same rule at compile time.

The plan:
  - batch axes: the mesh axes of q's dimension 0. block_table and seq_lens are split the same way.
  - head axes: the mesh axes of q's dimension 2 (query heads are independent).
  - the cache: when its page axis is split over exactly the batch axes, each shard keeps its own
    pages (data parallel: shard i holds pages [i * P / n, (i + 1) * P / n) and the requests of
    batch slice i); page ids stay GLOBAL and are rebased per shard, an id outside the shard's pages
    becoming invalid (-1), which the kernels report (CPU: an error; GPU: NaN for that request).
    Any other cache sharding is replicated first.
  - anything else (q sharded on s_q or the 576 columns, ...) is resharded before the shard_map
    (jax inserts the collectives), so results never depend on the sharding.
update_kv_cache: the cache keeps its page-axis split; new rows split over the same axes write
their own shard's pages, replicated new rows are written by the shard holding each page.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P


class Plan(NamedTuple):
    mesh: Any                       # jax.sharding.AbstractMesh
    batch_axes: tuple[str, ...]     # mesh axes splitting the batch (q's dim 0)
    head_axes: tuple[str, ...]      # mesh axes splitting the query heads (q's dim 2)
    pages_sharded: bool             # kv_cache's pages split over batch_axes (per-shard pages)

    @property
    def batch_entry(self):
        return _entry(self.batch_axes)

    @property
    def head_entry(self):
        return _entry(self.head_axes)

    def num_batch_shards(self) -> int:
        return int(np.prod([self.mesh.shape[a] for a in self.batch_axes], dtype=np.int64))


def _entry(axes: tuple[str, ...]):
    """A PartitionSpec entry for `axes`: None, one name, or a tuple of names."""
    if not axes:
        return None
    return axes[0] if len(axes) == 1 else axes


def _explicit_sharding(x: Any):
    """(abstract mesh, spec entries padded to x's rank) when x carries a sharding over Explicit
    mesh axes, else None."""
    try:
        sharding = jax.typeof(x).sharding
    except Exception:  # noqa: BLE001 - not an array jax can type: nothing to plan
        return None
    mesh = getattr(sharding, "mesh", None)
    spec = getattr(sharding, "spec", None)
    if mesh is None or spec is None or getattr(mesh, "empty", True):
        return None
    explicit = set(getattr(mesh, "explicit_axes", ()))
    if not explicit:
        return None
    entries = []
    for e in tuple(spec) + (None,) * (len(np.shape(x)) - len(spec)):
        axes = () if e is None else ((e,) if isinstance(e, str) else tuple(e))
        entries.append(tuple(a for a in axes if a in explicit))
    return mesh, entries


def plan(q: Any, kv_cache: Any, block_table: Any, seq_lens: Any) -> Plan | None:
    """How to split one mla_decode call, or None when no operand is split over explicit axes."""
    found = [_explicit_sharding(x) for x in (q, kv_cache, block_table, seq_lens)]
    meshes = [f[0] for f in found if f is not None]
    if not meshes:
        return None
    mesh = meshes[0]
    q_entries = found[0][1] if found[0] is not None and found[0][0] == mesh else [()] * 4
    batch_axes, head_axes = q_entries[0], q_entries[2]
    kv = found[1]
    pages_sharded = bool(batch_axes) and kv is not None and kv[0] == mesh and kv[1][0] == batch_axes
    if not batch_axes and not head_axes:
        # q is replicated: nothing to split here; the op's partitioning rule (_partitioning.py)
        # gathers a sharded cache or table.
        return None
    return Plan(mesh, batch_axes, head_axes, pages_sharded)


class CachePlan(NamedTuple):
    mesh: Any                       # jax.sharding.AbstractMesh
    page_axes: tuple[str, ...]      # mesh axes splitting kv_cache's pages (kept split)
    rows_split: bool                # new rows split over page_axes too (per-shard writes)

    def shard_plan(self) -> Plan:
        """The per-shard-pages rule as a Plan (for check_concrete_write_placement)."""
        return Plan(self.mesh, self.page_axes, (), True)


def cache_plan(kv_cache: Any, new_latent: Any, block_table: Any, positions: Any) -> CachePlan | None:
    """update_kv_cache's plan, None when no operand is split over explicit axes. The cache keeps
    its page-axis split; when new_latent's batch is split over the same axes each shard writes its
    requests into its own pages, otherwise every shard gets all new rows and writes those landing
    on its pages (the global scatter)."""
    found = [_explicit_sharding(x) for x in (kv_cache, new_latent, block_table, positions)]
    meshes = [f[0] for f in found if f is not None]
    if not meshes:
        return None
    mesh = meshes[0]
    kv, nl = found[0], found[1]
    page_axes = kv[1][0] if kv is not None and kv[0] == mesh else ()
    rows_split = (bool(page_axes) and nl is not None and nl[0] == mesh
                  and nl[1][0] == page_axes)
    return CachePlan(mesh, page_axes, rows_split)


def _foreign_page(p: Plan, table: np.ndarray, used: np.ndarray, num_pages: int):
    """First (r, i, shard, lo, hi) where a used table entry is not a page of request r's shard."""
    n = p.num_batch_shards()
    b = table.shape[0]
    per_shard = num_pages // n
    shard = (np.arange(b) // (b // n))[:, None]
    lo = shard * per_shard
    bad = used & ((table < lo) | (table >= lo + per_shard))
    if not bad.any():
        return None
    r, i = (int(v) for v in np.argwhere(bad)[0])
    s = int(shard[r, 0])
    return r, i, s, s * per_shard, (s + 1) * per_shard


def _placement_error(p: Plan, found, table, where: str, what: str) -> ValueError:
    r, i, s, lo, hi = found
    return ValueError(
        f"{where}: kv_cache's pages are sharded over the batch axes {p.batch_axes} like the "
        f"requests, so request {r} (on batch shard {s} of {p.num_batch_shards()}) may only {what} "
        f"that shard's pages [{lo}, {hi}), got block_table[{r}, {i}] = {int(table[r, i])}; "
        f"replicate kv_cache or place each request's pages on its shard")


def check_concrete_placement(p: Plan, block_table: Any, seq_lens: Any, num_pages: int,
                             page_size: int, where: str = "mla_decode") -> None:
    """With concrete inputs and per-shard pages, every page a request reads must be one of its
    shard's pages (a clear error at call time instead of the kernel's run-time error)."""
    from ._validate import is_concrete

    if not (p.pages_sharded and is_concrete(block_table) and is_concrete(seq_lens)):
        return
    table = np.asarray(block_table)
    used = -(-np.asarray(seq_lens) // page_size)
    read = np.arange(table.shape[1])[None, :] < used[:, None]
    found = _foreign_page(p, table, read, num_pages)
    if found:
        raise _placement_error(p, found, table, where, "read")


def check_concrete_write_placement(p: Plan, block_table: Any, positions: Any, num_pages: int,
                                   page_size: int, where: str = "update_kv_cache") -> None:
    """The same for update_kv_cache: the pages written (positions >= 0) must be the shard's."""
    from ._validate import is_concrete

    if not (is_concrete(block_table) and is_concrete(positions)):
        return
    table = np.asarray(block_table)
    pos = np.asarray(positions)
    written = np.zeros(table.shape, bool)
    rows, _ = np.nonzero(pos >= 0)
    written[rows, pos[pos >= 0] // page_size] = True
    found = _foreign_page(p, table, written, num_pages)
    if found:
        raise _placement_error(p, found, table, where, "write")


def conform(x: Any, mesh, spec: P):
    """x resharded to `spec` over mesh when its explicit sharding differs: shard_map takes
    inputs typed with explicit shardings only as its in_specs say, so other layouts (a cache split
    over other axes than the batch, q split on s_q, ...) are resharded first (jax inserts the
    collectives)."""
    found = _explicit_sharding(x)
    if found is None:
        return x
    want = [() if e is None else ((e,) if isinstance(e, str) else tuple(e)) for e in spec]
    want += [()] * (len(found[1]) - len(want))
    if found[1] == want:
        return x
    return jax.sharding.reshard(x, jax.sharding.NamedSharding(mesh, spec))


def local_page_ids(block_table, axes, local_pages: int):
    """Inside a manual computation over `axes`, whose shard i holds the global pages
    [i * local_pages, (i + 1) * local_pages): block_table's global ids made local, ids of other
    shards' pages made invalid (-1)."""
    base = jax.lax.axis_index(axes) * local_pages
    own = (block_table >= base) & (block_table < base + local_pages)
    return jnp.where(own, block_table - base, jnp.int32(-1))


def sharded_call(p: Plan, body, q, kv_cache, block_table, seq_lens, schedule):
    """Runs body(q, kv_cache, block_table, seq_lens, schedule_or_None) -> (out, lse) per shard.

    A schedule is only passed through when the batch is not split (it describes the whole batch);
    under batch sharding each shard plans its own requests inside the op.
    """
    B, H = p.batch_entry, p.head_entry
    q_spec = P(B, None, H, None)
    kv_spec = P(B) if p.pages_sharded else P()
    in_specs = [q_spec, kv_spec, P(B, None), P(B)]
    args = [q, kv_cache, block_table, seq_lens]
    keep_schedule = schedule is not None and not p.batch_axes
    if keep_schedule:
        in_specs.append(P())
        args.append(schedule)

    args = [conform(x, p.mesh, s) for x, s in zip(args, in_specs)]

    def per_shard(q, kv_cache, block_table, seq_lens, *sched):
        if p.pages_sharded:
            block_table = local_page_ids(block_table, B, kv_cache.shape[0])
        out, lse = body(q, kv_cache, block_table, seq_lens, sched[0] if sched else None)
        return out, lse

    out_specs = (P(B, None, H, None), P(B, None, H))
    # Manual over the mesh's Explicit axes only: Auto axes (a mixed mesh) stay with XLA.
    # Under jit even when called eagerly: an eager shard_map runs each primitive as its own
    # manual computation, so the (0,) schedule made in body becomes a zero-size operand of one,
    # which segfaults jaxlib 0.11.2's Shardy canonicalizer (ManualComputationUnusedInputsPattern;
    # 0.10.2 and 0.12.0.1 are fine). Under jit it stays a constant inside the computation.
    return jax.jit(jax.shard_map(per_shard, mesh=p.mesh, in_specs=tuple(in_specs),
                                 out_specs=out_specs, axis_names=set(p.mesh.explicit_axes)))(*args)
