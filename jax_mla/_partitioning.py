"""The partitioning rules XLA applies to mla_decode, mla_decode_sparse and update_kv_cache under
jit when their operands are sharded over Auto mesh axes (jit in_shardings, arrays arriving
sharded, shardings propagated from the surrounding computation).

Mechanism: jax.experimental.custom_partitioning, attached at lowering time. The primitives'
lowering rules (_lowering.py) emit the plain custom call / scatter when the module runs on one
device or inside a manual computation (shard_map, including the Explicit-axes path of
_sharding.py), and otherwise lower through a custom_partitioning function: its Shardy
sharding_rule (and, for GSPMD propagation, infer_sharding_from_operands) lets shardings propagate
through the op, and its partition callback, run by XLA's SPMD partitioner once propagation has
settled the operands' shardings, picks the split below and returns the per-shard computation. The
jaxpr keeps the plain primitives, so vmap, the Explicit-axes shard_map and single-device programs
are unchanged (jax's own cuDNN attention is built the same way). Why not the alternatives:
  - XLA alone replicates an unknown custom call (all-gathers its operands);
  - batch partitioning (jax.ffi.register_ffi_target_as_batch_partitionable) splits every operand
    along its leading axis, the cache's pages included, and cannot split heads;
  - the shard_map of _sharding.py needs the shardings at trace time, which Auto axes do not give.
custom_partitioning's callbacks are Python run at compile time: jax.export cannot serialize them.
A multi-device export of mla_decode outside a manual computation therefore fails with an error
naming the Explicit-axes / shard_map paths, which export (decided at lowering, where
`lowering_parameters.for_export` tells an export from a compilation). update_kv_cache exports as
its plain scatter, which XLA partitions by its generic scatter rule.

mla_decode's split (operand shardings as propagation left them):
  - batch axes: the mesh axes of q's dim 0 (else of out's); they must divide b. block_table and
    seq_lens are split the same way.
  - head axes: the mesh axes of q's dim 2 (else of out's); they must divide h_q.
  - kv_cache: pages kept split when its page axis is split over exactly the batch axes (per-shard
    pages, global ids rebased as in _sharding.py), replicated otherwise.
  - a passed schedule is used only when the batch is not split (it describes the whole batch).
  Every other operand layout is resharded to that by XLA, so results never depend on the layout.
mla_decode_sparse's split: batch and heads as mla_decode's (the batch axes also from indices,
topk_length or a per-request sink; the head axes also from attn_sink); the cache is replicated,
since indices are global slots into all of it (a page-split cache is gathered first, as on the
Explicit-axes path). Query tokens and their slots are never split.
update_kv_cache's split: the cache keeps its page-axis split (pages must divide evenly). New rows
split over the same axes write their own shard's pages (as the Explicit-axes path; writes to
another shard's pages are dropped); otherwise every shard gets all new rows and writes those
that land on its pages, i.e. the global scatter.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import dispatch
from jax._src.sharding_impls import ShardingContext
from jax.experimental.custom_partitioning import custom_partitioning
from jax.interpreters import mlir
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from . import _paged_write, _primitive, _sharding

EXPORT_ERROR = (
    "{op}: jax.export of a computation over {n} devices with {op} outside a manual "
    "computation: its automatic partitioning (for operands sharded over Auto mesh axes) is a "
    "compile-time callback that jax.export cannot serialize, and without it XLA would replicate "
    "the op (all-gather its operands). Shard q (and block_table, seq_lens, kv_cache) over "
    "Explicit mesh axes (jax.make_mesh(..., axis_types=(AxisType.Explicit, ...))), or call "
    "{op} inside jax.shard_map; both export.")


def _auto_partitioned_module(ctx) -> bool:
    """Whether the op is being lowered into a multi-device computation that XLA partitions (not
    a manual one: inside shard_map the axis context is an SPMDAxisContext)."""
    ac = ctx.module_context.axis_context
    return isinstance(ac, ShardingContext) and ac.num_devices > 1


def lowering(direct, partitioned, *, params: tuple[str, ...] = (), defaults: dict | None = None,
             multiple_results: bool, export_direct: bool, op: str = ""):
    """A lowering rule: `direct` (the plain lowering) on one device or in a manual computation,
    else the custom_partitioning function `partitioned` (operands, then the primitive's `params`
    in that order; `defaults` for optional ones a bind may omit). In an export: `direct` when
    export_direct, else EXPORT_ERROR naming the public function `op`."""
    names, defaults = params, dict(defaults or {})

    def rule(ctx, *args, **params):
        if not _auto_partitioned_module(ctx):
            return direct(ctx, *args, **params)
        if ctx.module_context.lowering_parameters.for_export:
            if export_direct:
                return direct(ctx, *args, **params)
            raise ValueError(EXPORT_ERROR.format(op=op,
                                                 n=ctx.module_context.axis_context.num_devices))
        static = tuple(params[k] if k in params else defaults[k] for k in names)
        fn = lambda *xs: partitioned(*xs, *static)  # noqa: E731
        return mlir.lower_fun(fn, multiple_results=multiple_results)(ctx, *args)
    return rule


# custom_partitioning's lowering needs the device assignment and mesh, which jit only computes for
# computations holding a primitive that asks for them.
dispatch.prim_requires_devices_during_lowering.add(_primitive.mla_decode_p)
dispatch.prim_requires_devices_during_lowering.add(_primitive.mla_decode_sparse_p)
dispatch.prim_requires_devices_during_lowering.add(_primitive.kv_cache_update_p)


# ----------------------------------------------------------------------------------------------
# Shardings as mesh axes per dimension
# ----------------------------------------------------------------------------------------------

def _dim_axes(x: Any) -> list[tuple[str, ...]] | None:
    """Per dimension of x (a ShapeDtypeStruct from the partitioner), the mesh axes splitting it;
    None when x carries no NamedSharding (no mesh: the computation has no NamedSharding)."""
    sharding = getattr(x, "sharding", None)
    if not isinstance(sharding, NamedSharding):
        return None
    spec = tuple(sharding.spec) + (None,) * (len(x.shape) - len(sharding.spec))
    return [() if e is None else ((e,) if isinstance(e, str) else tuple(e)) for e in spec]


def _size(mesh, axes) -> int:
    return int(np.prod([mesh.shape[a] for a in axes], dtype=np.int64))


def _dividing(mesh, axes, n: int) -> tuple[str, ...]:
    """axes when they split n evenly (uneven splits would pad the operands), else ()."""
    return tuple(axes) if axes and n % _size(mesh, axes) == 0 else ()


def _replicated_everywhere(mesh, arg_shapes):
    """With no named mesh (the computation's shardings are not NamedShardings): the op runs
    whole on every device. Returns (mesh, sharding) for that."""
    if mesh.empty:
        devices = next(a.sharding for a in jax.tree_util.tree_leaves(arg_shapes))._device_assignment
        mesh = Mesh(np.asarray(devices), ("jax_mla_devices",))
    return mesh, NamedSharding(mesh, P())


def _in_rule_order(rule: str, factors: str) -> tuple[str, ...]:
    """The named factors that occur in the Shardy rule, in the order of their first occurrence
    (the verifier wants a rule's special factors sorted by factor index)."""
    order = list(dict.fromkeys(rule.replace(",", " ").replace("->", " ").split()))
    wanted = set(factors.split())
    return tuple(f for f in order if f in wanted)


# ----------------------------------------------------------------------------------------------
# mla_decode
# ----------------------------------------------------------------------------------------------

def _first(mesh, candidates, n: int) -> tuple[str, ...]:
    """The first non-empty candidate that splits n evenly, else ()."""
    return next((c for c in (_dividing(mesh, c, n) for c in candidates) if c), ())


class _DecodeSplit:
    """mla_decode's split for the operand (and, when known, result) shardings: the batch and
    heads as q has them, else as the result (what its consumer wants) or, for the batch, the
    block table and lengths have them."""

    def __init__(self, mesh, q, kv_cache, block_table, seq_lens, out=None):
        b, _, h, _ = q.shape
        qa, bta, sla = (_dim_axes(x) or [()] * len(x.shape) for x in (q, block_table, seq_lens))
        oa = (_dim_axes(out) if out is not None else None) or [()] * 4
        self.batch = _first(mesh, (qa[0], oa[0], bta[0], sla[0]), b)
        heads = [a for a in (qa[2], oa[2]) if not set(a) & set(self.batch)]
        self.heads = _first(mesh, heads, h)
        kva = _dim_axes(kv_cache) or [()] * 3
        self.pages_sharded = (bool(self.batch) and kva[0] == self.batch
                              and kv_cache.shape[0] % _size(mesh, self.batch) == 0)
        B, H = _sharding._entry(self.batch), _sharding._entry(self.heads)
        self.in_specs = (P(B, None, H, None), P(B) if self.pages_sharded else P(), P(B, None), P(B))
        self.out_specs = (P(B, None, H, None), P(B, None, H))


def _decode_rule(softmax_scale, causal, num_parts, kernel, chunk_blocks, mesh, operand_types,
                 result_types):
    # Shardy: batch (b) and heads (h) pass through; the rest must not pick up shardings from
    # the op (s_q splits change causal positions, the 576 / 512 columns, pages and table
    # columns are read whole). The partition callback settles the cache's page axis. The cache's
    # row (k) is its own factor: 576 values, or 656 bytes in an FP8 cache.
    rule = "b s h d, p g k, b m, b, n -> b s h v, b s h"
    return rule, dict(need_replication_factors=_in_rule_order(rule, "s d g k m n v"))


def _decode_infer(softmax_scale, causal, num_parts, kernel, chunk_blocks, mesh, arg_shapes,
                  result_shape):
    if mesh.empty or _dim_axes(arg_shapes[0]) is None:
        return None
    return [NamedSharding(mesh, s) for s in _DecodeSplit(mesh, *arg_shapes[:4]).out_specs]


def _decode_partition(softmax_scale, causal, num_parts, kernel, chunk_blocks, mesh, arg_shapes,
                      result_shape):
    q, kv_cache, block_table, seq_lens, schedule = arg_shapes
    # chunk_blocks (batch_invariant's chunk) goes to every shard: the per-shard plan is then the
    # batch-invariant one, so the shards' bits are those of the unsharded call.
    params = dict(softmax_scale=softmax_scale, causal=causal, kernel=kernel,
                  chunk_blocks=chunk_blocks)
    if mesh.empty or _dim_axes(q) is None:
        mesh, rep = _replicated_everywhere(mesh, arg_shapes)

        def whole(*args):
            return _primitive.mla_decode_p.bind(*args, num_parts=num_parts, **params)

        return mesh, whole, [rep, rep], (rep,) * 5

    split = _DecodeSplit(mesh, q, kv_cache, block_table, seq_lens, result_shape[0])
    # The schedule describes the whole batch: with the batch split it is not read, and is left
    # where it is (no resharding of an unused operand).
    keep_schedule = schedule.shape[0] > 0 and not split.batch
    sched_sharding = NamedSharding(mesh, P()) if keep_schedule else schedule.sharding
    arg_shardings = tuple(NamedSharding(mesh, s) for s in split.in_specs) + (sched_sharding,)
    # A list, like the primitive's results.
    out_shardings = [NamedSharding(mesh, s) for s in split.out_specs]
    parts = num_parts
    if schedule.shape[0] == 0 and split.heads:
        # Planned in the op with the default number of parts: the default for the shard's heads,
        # as the Explicit-axes path (which calls mla_decode per shard) picks.
        from ._api import default_num_parts
        parts = default_num_parts(q.shape[1], q.shape[2] // _size(mesh, split.heads))

    def per_shard(q, kv_cache, block_table, seq_lens, schedule):
        if split.pages_sharded:
            block_table = _sharding.local_page_ids(block_table, _sharding._entry(split.batch),
                                                   kv_cache.shape[0])
        if not keep_schedule:
            schedule = jnp.zeros((0,), jnp.int32)
        return _primitive.mla_decode_p.bind(q, kv_cache, block_table, seq_lens, schedule,
                                            num_parts=parts, **params)

    return mesh, per_shard, out_shardings, arg_shardings


def _decode_global(q, kv_cache, block_table, seq_lens, schedule, softmax_scale, causal,
                   num_parts, kernel, chunk_blocks):
    return _primitive.mla_decode_p.bind(q, kv_cache, block_table, seq_lens, schedule,
                                        softmax_scale=softmax_scale, causal=causal,
                                        num_parts=num_parts, kernel=kernel,
                                        chunk_blocks=chunk_blocks)


decode = custom_partitioning(_decode_global, static_argnums=(5, 6, 7, 8, 9))
decode.def_partition(partition=_decode_partition, infer_sharding_from_operands=_decode_infer,
                     sharding_rule=_decode_rule)


# ----------------------------------------------------------------------------------------------
# mla_decode_sparse
# ----------------------------------------------------------------------------------------------

class _SparseSplit:
    """mla_decode_sparse's split: the batch as q has it, else as the result, indices,
    topk_length or a per-request (b, h_q) sink have it; the heads as q, else the result, else
    attn_sink. The cache is always whole (indices are global slots)."""

    def __init__(self, mesh, q, indices, topk_length, attn_sink, out=None):
        b, _, h, _ = q.shape
        qa, ia = (_dim_axes(x) or [()] * len(x.shape) for x in (q, indices))
        oa = (_dim_axes(out) if out is not None else None) or [()] * 4
        has_len, sink_rank = topk_length.shape[0] > 0, len(attn_sink.shape)
        sink_rank = sink_rank if attn_sink.shape[-1] > 0 else 0
        tla = (_dim_axes(topk_length) or [()]) if has_len else [()]
        sa = (_dim_axes(attn_sink) or [()] * sink_rank) if sink_rank else []
        sink_batch = sa[0] if sink_rank == 2 else ()
        sink_heads = sa[-1] if sink_rank else ()
        self.batch = _first(mesh, (qa[0], oa[0], ia[0], tla[0], sink_batch), b)
        heads = [a for a in (qa[2], oa[2], sink_heads) if not set(a) & set(self.batch)]
        self.heads = _first(mesh, heads, h)
        B, H = _sharding._entry(self.batch), _sharding._entry(self.heads)
        sink_spec = {0: P(), 1: P(H), 2: P(B, H)}[sink_rank]
        self.in_specs = (P(B, None, H, None), P(), P(B, None, None), P(B) if has_len else P(),
                         sink_spec)
        self.out_specs = (P(B, None, H, None), P(B, None, H))


def _sparse_rule(softmax_scale, chunk_blocks, mesh, operand_types, result_types):
    # Shardy: batch (b) and heads (h) pass through. Query tokens (s), columns, the cache (read
    # whole: indices are global slots) and the selected slots (t) are not split. topk_length is
    # (b,) or (0,), attn_sink (h_q,), (b, h_q) or (0,): an empty one is a factor of its own.
    tl = "b" if operand_types[3].shape[0] else "z"
    sink = {0: "y", 1: "h", 2: "b h"}[len(operand_types[4].shape) if operand_types[4].shape[-1] else 0]
    rule = f"b s h d, p g k, b s t, {tl}, {sink} -> b s h v, b s h"
    return rule, dict(need_replication_factors=_in_rule_order(rule, "s d p g k t z y v"))


def _sparse_infer(softmax_scale, chunk_blocks, mesh, arg_shapes, result_shape):
    if mesh.empty or _dim_axes(arg_shapes[0]) is None:
        return None
    q, _, indices, topk_length, attn_sink = arg_shapes
    return [NamedSharding(mesh, s)
            for s in _SparseSplit(mesh, q, indices, topk_length, attn_sink).out_specs]


def _sparse_partition(softmax_scale, chunk_blocks, mesh, arg_shapes, result_shape):
    q, _, indices, topk_length, attn_sink = arg_shapes
    params = dict(softmax_scale=softmax_scale, chunk_blocks=chunk_blocks)

    def per_shard(*args):
        # Every query token's slots stay on one shard, so with chunk_blocks (batch_invariant) the
        # shards' bits are those of the unsharded call.
        return _primitive.mla_decode_sparse_p.bind(*args, **params)

    if mesh.empty or _dim_axes(q) is None:
        mesh, rep = _replicated_everywhere(mesh, arg_shapes)
        return mesh, per_shard, [rep, rep], (rep,) * 5
    split = _SparseSplit(mesh, q, indices, topk_length, attn_sink, result_shape[0])
    return (mesh, per_shard, [NamedSharding(mesh, s) for s in split.out_specs],
            tuple(NamedSharding(mesh, s) for s in split.in_specs))


def _sparse_global(q, kv_cache, indices, topk_length, attn_sink, softmax_scale, chunk_blocks):
    return _primitive.mla_decode_sparse_p.bind(q, kv_cache, indices, topk_length, attn_sink,
                                               softmax_scale=softmax_scale,
                                               chunk_blocks=chunk_blocks)


decode_sparse = custom_partitioning(_sparse_global, static_argnums=(5, 6))
decode_sparse.def_partition(partition=_sparse_partition, infer_sharding_from_operands=_sparse_infer,
                            sharding_rule=_sparse_rule)


# ----------------------------------------------------------------------------------------------
# update_kv_cache
# ----------------------------------------------------------------------------------------------

def _cache_specs(mesh, kv_cache, new_latent):
    """(page axes kept split, rows split over them too) for the given shardings."""
    pages = _dividing(mesh, (_dim_axes(kv_cache) or [()])[0], kv_cache.shape[0])
    rows = (_dim_axes(new_latent) or [()])[0]
    return pages, bool(pages) and rows == pages and new_latent.shape[0] % _size(mesh, pages) == 0


def _cache_rule(mesh, operand_types, result_types):
    # The cache's page axis passes through to the result (a donated cache keeps its layout);
    # new rows' batch is shared by rows, table and positions. The cache's row (k) and the new
    # rows' (d) are distinct factors: an FP8 cache stores 656 bytes per 576-wide row.
    rank4 = len(operand_types[0].shape) == 4
    cache = "p g o k" if rank4 else "p g k"
    rule = f"{cache}, b t d, b m, b t -> {cache}"
    return rule, dict(need_replication_factors=_in_rule_order(rule, "g o k t d m"))


def _cache_infer(mesh, arg_shapes, result_shape):
    if mesh.empty or _dim_axes(arg_shapes[0]) is None:
        return None
    pages, _ = _cache_specs(mesh, arg_shapes[0], arg_shapes[1])
    return NamedSharding(mesh, P(_sharding._entry(pages)))


def _cache_partition(mesh, arg_shapes, result_shape):
    kv_cache, new_latent = arg_shapes[:2]
    if mesh.empty or _dim_axes(kv_cache) is None:
        mesh, rep = _replicated_everywhere(mesh, arg_shapes)
        return mesh, _paged_write.write, rep, (rep,) * 4
    pages, rows_split = _cache_specs(mesh, kv_cache, new_latent)
    A = _sharding._entry(pages)
    R = A if rows_split else None
    cache = NamedSharding(mesh, P(A))
    arg_shardings = (cache, NamedSharding(mesh, P(R)), NamedSharding(mesh, P(R, None)),
                     NamedSharding(mesh, P(R, None)))

    def per_shard(kv_cache, new_latent, block_table, positions):
        if pages:
            block_table = _sharding.local_page_ids(block_table, A, kv_cache.shape[0])
        return _paged_write.write(kv_cache, new_latent, block_table, positions)

    return mesh, per_shard, cache, arg_shardings


cache_update = custom_partitioning(_paged_write.write)
cache_update.def_partition(partition=_cache_partition, infer_sharding_from_operands=_cache_infer,
                           sharding_rule=_cache_rule)

