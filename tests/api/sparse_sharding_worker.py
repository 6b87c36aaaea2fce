"""Multi-device checks of jax_mla.mla_decode_sparse, run by tests/api/test_sparse_sharding.py in a
subprocess with 8 forced CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count=8):

    python3 -P tests/api/sparse_sharding_worker.py

Prints "NAME: ok" per check and exits 1 on the first failure. Each check compares the sharded call
with the unsharded one (same kernel, so equal up to 1 ulp of the output dtype).
"""

from __future__ import annotations

import re
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_mla

COLLECTIVES = re.compile(r"\b(all-gather|all-reduce|collective-permute|all-to-all|reduce-scatter)(-start)?\b")


def inputs(b=8, s_q=2, h_q=16, topk=32, pages=8, page_size=16, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((b, s_q, h_q, 576)).astype(jnp.bfloat16)
    kv = np.asarray(jax_mla.pack_fp8_kv(jnp.asarray(rng.standard_normal((pages, page_size, 576)), jnp.float32)))
    idx = rng.integers(-1, pages * page_size, (b, s_q, topk)).astype(np.int32)
    tl = rng.integers(0, topk + 1, (b,)).astype(np.int32)
    sink = rng.standard_normal(h_q).astype(np.float32)
    return q, kv, idx, tl, sink


def call(q, kv, idx, tl, sink):
    return jax_mla.mla_decode_sparse(q, kv, idx, topk_length=tl, attn_sink=sink, return_lse=True)


def agree(got, want):
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32), rtol=2**-7, atol=1e-6)


def put(mesh, arrays, specs):
    return [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(arrays, specs)]


def explicit(cache_spec):
    mesh = jax.make_mesh((4, 2), ("b", "h"), axis_types=(AxisType.Explicit,) * 2)
    args = inputs()
    want = call(*args)
    specs = [P("b", None, "h", None), cache_spec, P("b"), P("b"), P("h")]
    sharded = put(mesh, args, specs)
    got = call(*sharded)  # eager
    agree(got, want)
    assert tuple(got[0].sharding.spec)[:3] == ("b", None, "h"), got[0].sharding.spec
    fn = jax.jit(call)
    agree(fn(*sharded), want)
    text = fn.lower(*sharded).compile().as_text()
    assert "jax_mla_decode_sparse" in text
    found = sorted({m.group(0) for m in COLLECTIVES.finditer(text)})
    if cache_spec == P():
        assert not found, f"collectives {found}"
    exp = jax.export.export(fn, disabled_checks=jax_mla.export_disabled_checks())(*sharded)
    agree(jax.export.deserialize(exp.serialize()).call(*sharded), want)


def batch_only_and_heads_only():
    args = inputs()
    want = call(*args)
    for shape, specs in (((8,), [P("x"), P(), P("x"), P("x"), P()]),
                         ((2,), [P(None, None, "x"), P(), P(), P(), P("x")])):
        mesh = jax.make_mesh(shape, ("x",), axis_types=(AxisType.Explicit,), devices=jax.devices()[:shape[0]])
        agree(jax.jit(call)(*put(mesh, args, specs)), want)


def collectives(fn, *args):
    text = fn.lower(*args).compile().as_text()
    assert "jax_mla_decode_sparse" in text
    return sorted({m.group(0) for m in COLLECTIVES.finditer(text)})


def auto_axes(committed, cache_spec=P(), gspmd=False):
    """Auto mesh axes (jit in_shardings, or arrays arriving sharded): the op's custom_partitioning
    rule runs one call per shard, split as the operands are, with no collective when the cache is
    replicated; a page-split cache is gathered (indices are global slots)."""
    mesh = jax.make_mesh((4, 2), ("b", "h"), axis_types=(AxisType.Auto,) * 2)
    args = inputs(seed=3)
    want = call(*args)
    specs = [P("b", None, "h", None), cache_spec, P("b"), P("b"), P("h")]
    if committed:
        fn, args = jax.jit(call), put(mesh, args, specs)
    else:
        fn = jax.jit(call, in_shardings=[NamedSharding(mesh, s) for s in specs])
    shardy = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", not gspmd)
    try:
        got = fn(*args)
        agree(got, want)
        assert tuple(got[0].sharding.spec)[:3] == ("b", None, "h"), got[0].sharding.spec
        assert tuple(got[1].sharding.spec)[:3] == ("b", None, "h"), got[1].sharding.spec
        found = collectives(fn, *args)
    finally:
        jax.config.update("jax_use_shardy_partitioner", shardy)
    if cache_spec == P():
        assert not found, f"collectives {found}"
    else:
        assert found == ["all-gather"], found


def auto_axes_from_indices_and_sink():
    """Only indices (batch) and attn_sink (heads) are sharded: the op takes its split from them
    and the result comes out split that way."""
    mesh = jax.make_mesh((4, 2), ("b", "h"), axis_types=(AxisType.Auto,) * 2)
    args = inputs(seed=4)
    want = call(*args)
    specs = [P(), P(), P("b"), P(), P("h")]
    fn = jax.jit(call, in_shardings=[NamedSharding(mesh, s) for s in specs])
    got = fn(*args)
    agree(got, want)
    assert tuple(got[0].sharding.spec)[:3] == ("b", None, "h"), got[0].sharding.spec


def auto_axes_vmapped_sinks():
    """vmap with a sink per instance binds the (V * b, h_q) sink form; split over V on an Auto
    axis, each shard gets its instances' sinks."""
    mesh = jax.make_mesh((8,), ("v",), axis_types=(AxisType.Auto,))
    q, kv, idx, tl, _ = inputs(b=2, seed=5)
    rng = np.random.default_rng(6)
    v = 8
    qs = np.stack([q] * v) + rng.standard_normal((v,) + q.shape).astype(q.dtype)
    idxs = rng.integers(-1, kv.shape[0] * kv.shape[1], (v,) + idx.shape).astype(np.int32)
    sinks = rng.standard_normal((v, q.shape[2])).astype(np.float32)
    mapped = jax.vmap(lambda q, i, s: call(q, kv, i, tl, s))
    want = jax.jit(mapped)(qs, idxs, sinks)
    fn = jax.jit(mapped, in_shardings=[NamedSharding(mesh, P("v"))] * 3)
    got = fn(qs, idxs, sinks)
    agree(got, want)
    assert tuple(got[0].sharding.spec)[:1] == ("v",), got[0].sharding.spec
    assert not collectives(fn, qs, idxs, sinks)


def auto_axes_export_is_refused():
    """The Auto-axes rule is a compile-time callback: a multi-device export of the op outside a
    manual computation fails, naming the ways that export (Explicit axes, shard_map)."""
    mesh = jax.make_mesh((4, 2), ("b", "h"), axis_types=(AxisType.Auto,) * 2)
    args = inputs()
    specs = [P("b", None, "h", None), P(), P("b"), P("b"), P("h")]
    fn = jax.jit(call, in_shardings=[NamedSharding(mesh, s) for s in specs])
    try:
        jax.export.export(fn, disabled_checks=jax_mla.export_disabled_checks())(*args)
    except ValueError as e:
        text = str(e)
        assert "mla_decode_sparse" in text and "Explicit" in text and "shard_map" in text, text
    else:
        raise AssertionError("an export under Auto axes did not fail")


CHECKS = {
    "explicit_batch_heads": lambda: explicit(P()),
    "explicit_cache_pages_split": lambda: explicit(P("b")),
    "explicit_batch_only_heads_only": batch_only_and_heads_only,
    "auto_batch_heads": lambda: auto_axes(committed=False),
    "auto_batch_heads_committed": lambda: auto_axes(committed=True),
    "auto_batch_heads_gspmd": lambda: auto_axes(committed=True, gspmd=True),
    "auto_cache_pages_split": lambda: auto_axes(committed=False, cache_spec=P("b")),
    "auto_from_indices_and_sink": auto_axes_from_indices_and_sink,
    "auto_vmapped_sinks": auto_axes_vmapped_sinks,
    "auto_export_is_refused": auto_axes_export_is_refused,
}


def main() -> int:
    assert len(jax.devices()) == 8, jax.devices()
    for name, check in CHECKS.items():
        try:
            check()
        except Exception as e:  # noqa: BLE001
            print(f"{name}: FAILED {type(e).__name__}: {e}")
            return 1
        print(f"{name}: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
