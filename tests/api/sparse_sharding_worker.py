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


def auto_axes():
    mesh = jax.make_mesh((4, 2), ("b", "h"), axis_types=(AxisType.Auto,) * 2)
    args = inputs()
    want = call(*args)
    specs = [P("b", None, "h", None), P(), P("b"), P("b"), P("h")]
    shardings = [NamedSharding(mesh, s) for s in specs]
    got = jax.jit(call, in_shardings=shardings)(*args)
    agree(got, want)


CHECKS = {
    "explicit_batch_heads": lambda: explicit(P()),
    "explicit_cache_pages_split": lambda: explicit(P("b")),
    "explicit_batch_only_heads_only": batch_only_and_heads_only,
    "auto_axes_replicate": auto_axes,
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
