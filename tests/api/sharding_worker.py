"""Multi-device checks of jax_mla.mla_decode and update_kv_cache, run by
tests/api/test_sharding.py in a subprocess.

They need 8 CPU devices, i.e. XLA_FLAGS=--xla_force_host_platform_device_count=8 before jax
initialises, which a pytest process that already imported jax cannot get; hence this script:

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python3 tests/api/sharding_worker.py OUT.json [NAME ...]

On a machine with several GPUs (issue #8) the same checks run on them with
JAX_MLA_SHARDING_DEVICES=N (an even number; default 8) and no XLA_FLAGS: `benchmarks/device_run.sh
multigpu` does that with N = the GPU count.

runs the checks (all, or the named ones) and writes {name: {"ok": bool, "error": str, "seconds": float}}
to OUT.json. Each check compares sharded results with the unsharded call and the reference, and
looks for collectives in the compiled HLO. Most run once per way the shardings reach jit (MODES:
Explicit axes, Auto axes as jit in_shardings, Auto-sharded arrays), named "check[mode]".
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import re
import sys
import time
import traceback

# cases.py is in tests/, one folder up.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import cases  # noqa: E402
import jax_mla  # noqa: E402

NUM_DEVICES = int(os.environ.get("JAX_MLA_SHARDING_DEVICES", "8"))
COLLECTIVES = re.compile(r"\b(all-gather|all-reduce|collective-permute|all-to-all|reduce-scatter|"
                         r"collective-broadcast|ragged-all-to-all)(-start)?\b")


# ----------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------

def mesh(shape, names, auto=False):
    kind = AxisType.Auto if auto else AxisType.Explicit
    return jax.make_mesh(shape, names, axis_types=(kind,) * len(names))


def put(mesh_, arrays, specs):
    return [jax.device_put(a, NamedSharding(mesh_, s)) for a, s in zip(arrays, specs)]


def collectives(compiled_text: str) -> list[str]:
    return sorted({m.group(0) for m in COLLECTIVES.finditer(compiled_text)})


def assert_no_collectives(fn, *args):
    text = fn.lower(*args).compile().as_text()
    assert "jax_mla_decode" in text, "the op is missing from the compiled HLO"
    found = collectives(text)
    assert not found, f"compiled HLO has collectives {found}"
    return text


def assert_agree(got, want, dtype="bfloat16"):
    """Same problem, possibly split differently: equal up to fp32 noise and output rounding."""
    u = cases.UNIT_ROUNDOFF[dtype]
    got_out, got_lse = (np.asarray(x, np.float64) for x in got)
    want_out, want_lse = (np.asarray(x, np.float64) for x in want)
    assert got_out.shape == want_out.shape and got_lse.shape == want_lse.shape
    assert np.isfinite(got_out).all(), "non-finite output"
    err = np.abs(got_out - want_out)
    assert (err <= 2 * u * np.abs(want_out) + 1e-5).all(), f"out differs by up to {err.max():.3g}"
    np.testing.assert_array_equal(np.isneginf(got_lse), np.isneginf(want_lse))
    fin = np.isfinite(want_lse)
    np.testing.assert_allclose(got_lse[fin], want_lse[fin], rtol=1e-5, atol=1e-5)


def decode(q, kv, bt, sl, schedule=None):
    return jax_mla.mla_decode(q, kv, bt, sl, return_lse=True, schedule=schedule)


def sharded_pages_data(num_shards, lens_per_shard, h_q=16, s_q=1, page_size=16, seed=0,
                       rank4=False, make=cases.make):
    """A batch of num_shards * len(lens_per_shard) requests whose pages live on their shard.

    Shard i holds requests [i*k, (i+1)*k) and pages [i*P, (i+1)*P) of the global cache; the
    block table holds GLOBAL page ids. Returns (CaseData of the global problem, per-shard
    CaseDatas with local ids). make=cases.make_fp8 builds an FP8 (uint8) cache."""
    shards = [make(cases.Case(lens=tuple(int(x) + 7 * i for x in lens_per_shard), h_q=h_q,
                              s_q=s_q, page_size=page_size, seed=seed + i, rank4_cache=rank4))
              for i in range(num_shards)]
    per = max(d.kv_cache.shape[0] for d in shards)
    width = max(d.block_table.shape[1] for d in shards)
    kvs, tables = [], []
    for i, d in enumerate(shards):
        poison = 0xFF if d.kv_cache.dtype == np.uint8 else np.nan  # FP8: NaN values and scales
        kv = np.full((per,) + d.kv_cache.shape[1:], poison, d.kv_cache.dtype)
        kv[:d.kv_cache.shape[0]] = d.kv_cache
        d.kv_cache = kv
        d.block_table = np.pad(d.block_table, ((0, 0), (0, width - d.block_table.shape[1])),
                               constant_values=-1)
        own = (d.block_table >= 0) & (d.block_table < per)
        kvs.append(kv)
        tables.append(np.where(own, d.block_table + i * per, -1).astype(np.int32))
    case = shards[0].case.replace(lens=tuple(n for d in shards for n in d.case.lens))
    data = cases.CaseData(case, np.concatenate([d.q for d in shards]), np.concatenate(kvs),
                          np.concatenate(tables), np.concatenate([d.seq_lens for d in shards]),
                          [k for d in shards for k in d.dense_kv])
    return data, shards


def global_data(lens, h_q=16, seed=0, page_size=16, make=cases.make):
    """A batch whose page ids are a random permutation of the whole cache (no shard locality)."""
    extra = (-sum(-(-n // page_size) for n in lens)) % NUM_DEVICES  # pages divisible by 8
    return make(cases.Case(lens=tuple(lens), h_q=h_q, page_size=page_size, seed=seed,
                           extra_pages=extra or NUM_DEVICES))


def check_against_reference(data, got):
    cases.assert_close_rounding_only(*got, *cases.reference(data), data.case.dtype,
                                     cases.max_abs_score(data), cases.max_abs_value(data))


LENS = (5, 70, 0, 33, 100, 1, 64, 65, 17, 16, 130, 2, 48, 49, 9, 80)


# ----------------------------------------------------------------------------------------------
# How a check's inputs reach jit: MODES
# ----------------------------------------------------------------------------------------------

# explicit:   arrays put with NamedShardings on an Explicit mesh, plain jit (shardings in the types)
# auto:       jit(in_shardings=NamedShardings on an Auto mesh) called with NumPy arrays
# committed:  arrays put with NamedShardings on an Auto mesh (arriving sharded), plain jit
MODES = ("explicit", "auto", "committed")


def sharded(fn, mode, mesh_, arrays, specs, **jit_kwargs):
    """(jitted fn, its arguments) for `mode`; mesh_ is Explicit for "explicit", else Auto."""
    if mode == "auto":
        shardings = tuple(NamedSharding(mesh_, s) for s in specs)
        return jax.jit(fn, in_shardings=shardings, **jit_kwargs), list(arrays)
    return jax.jit(fn, **jit_kwargs), put(mesh_, arrays, specs)


def mode_mesh(mode, shape, names):
    return mesh(shape, names, auto=mode != "explicit")


# ----------------------------------------------------------------------------------------------
# Checks, in every mode
# ----------------------------------------------------------------------------------------------

def check_batch_sharded_pages_per_shard(mode):
    """Data parallel: q, cache pages, block table and lengths split over the devices."""
    data, _ = sharded_pages_data(NUM_DEVICES, (5, 70))
    m = mode_mesh(mode, (NUM_DEVICES,), ("data",))
    fn, args = sharded(decode, mode, m, data.args, [P("data")] * 4)
    got = fn(*args)
    assert got[0].sharding.spec[0] == "data" and got[1].sharding.spec[0] == "data", got[0].sharding
    assert_agree(got, jax.jit(decode)(*data.args))
    check_against_reference(data, got)
    assert_no_collectives(fn, *args)
    if mode != "auto":
        # Eager (not jitted) calls take the same path.
        assert_agree(decode(*args), got)


def check_batch_sharded_replicated_cache(mode):
    """Data parallel over requests reading one replicated cache with global page ids."""
    data = global_data(LENS, seed=11)
    m = mode_mesh(mode, (NUM_DEVICES,), ("data",))
    fn, args = sharded(decode, mode, m, data.args, [P("data"), P(), P("data"), P("data")])
    got = fn(*args)
    assert got[0].sharding.spec[0] == "data", got[0].sharding
    assert_agree(got, jax.jit(decode)(*data.args))
    check_against_reference(data, got)
    assert_no_collectives(fn, *args)


def check_heads_sharded(mode):
    """Tensor parallel: q split on its head axis; cache, table and lengths replicated."""
    data = global_data(LENS[:6], h_q=16, seed=12)
    m = mode_mesh(mode, (NUM_DEVICES,), ("model",))
    fn, args = sharded(decode, mode, m, data.args, [P(None, None, "model"), P(), P(), P()])
    got = fn(*args)
    assert got[0].sharding.spec[2] == "model" and got[1].sharding.spec[2] == "model"
    assert_agree(got, jax.jit(decode)(*data.args))
    check_against_reference(data, got)
    assert_no_collectives(fn, *args)
    if mode != "auto":
        assert_agree(decode(*args), got)


def check_batch_and_heads_2d_mesh_rank4_cache(mode):
    """N/2-way data parallel x 2-way tensor parallel, per-shard pages, a (P, page, 1, 576) cache."""
    data, _ = sharded_pages_data(NUM_DEVICES // 2, (5, 70, 33), h_q=8, s_q=2, rank4=True, seed=20)
    m = mode_mesh(mode, (NUM_DEVICES // 2, 2), ("data", "model"))
    fn, args = sharded(decode, mode, m, data.args,
                       [P("data", None, "model"), P("data"), P("data"), P("data")])
    got = fn(*args)
    assert tuple(got[0].sharding.spec)[:3] == ("data", None, "model"), got[0].sharding
    assert_agree(got, jax.jit(decode)(*data.args))
    check_against_reference(data, got)
    assert_no_collectives(fn, *args)


def check_schedule_under_batch_sharding(mode):
    """A decode_schedule made for the global batch is dropped under batch sharding; each shard
    plans its own requests inside the op (schedule operand of shape (0,)), with no collective."""
    data, _ = sharded_pages_data(NUM_DEVICES, (5, 130))
    m = mode_mesh(mode, (NUM_DEVICES,), ("data",))

    def two_layers(q, kv, bt, sl):
        sched = jax_mla.decode_schedule(sl, num_heads=16, num_parts=3)
        o1, l1 = decode(q, kv, bt, sl, sched)
        o2, l2 = decode(-q, kv, bt, sl, sched)  # another layer's query (no CSE)
        return o1, l1, o2, l2

    fn, args = sharded(two_layers, mode, m, data.args, [P("data")] * 4)
    got = fn(*args)
    want = jax.jit(two_layers)(*data.args)
    assert_agree(got[:2], want[:2])
    assert_agree(got[2:], want[2:])
    text = assert_no_collectives(fn, *args)
    assert "jax_mla_decode_schedule" not in text, "the unused global schedule was not removed"
    calls = [ln for ln in text.splitlines() if 'custom_call_target="jax_mla_decode"' in ln]
    assert len(calls) == 2 and all("s32[0]" in ln for ln in calls), calls
    assert all("num_parts = 3" in ln for ln in calls), "the schedule's num_parts was not kept"


def check_schedule_under_heads_sharding(mode):
    """With only the heads split every shard has the whole batch: the passed schedule is used."""
    data = global_data(LENS[:6], seed=13)
    m = mode_mesh(mode, (NUM_DEVICES,), ("model",))

    def two_layers(q, kv, bt, sl):
        sched = jax_mla.decode_schedule(sl, num_heads=16, num_parts=5)
        return decode(q, kv, bt, sl, sched) + decode(-q, kv, bt, sl, sched)

    fn, args = sharded(two_layers, mode, m, data.args, [P(None, None, "model"), P(), P(), P()])
    got = fn(*args)
    assert_agree(got[:2], jax.jit(two_layers)(*data.args)[:2])
    check_against_reference(data, got[:2])
    text = assert_no_collectives(fn, *args)
    assert text.count('custom_call_target="jax_mla_decode_schedule"') == 1
    size = 5 * 8 + 2 * 6 + 3  # schedule_size(b=6, num_parts=5)
    calls = [ln for ln in text.splitlines() if 'custom_call_target="jax_mla_decode"' in ln]
    assert len(calls) == 2 and all(f"s32[{size}]" in ln for ln in calls), calls


def check_step_with_projections(mode):
    """A step as model code writes it (examples/deepseek_v3_mla.py): the query projected from
    hidden states, mla_decode, the per-head value projection and the output projection, with
    the batch split (and, on a 2-D mesh, the heads: their weights split, no output projection,
    which would sum over heads). No collective; values as on one device."""
    h, d = 16, 64
    # Pages per shard for 8 shards are also pages per shard for 4 (two neighbours' together).
    data, _ = sharded_pages_data(NUM_DEVICES, (5, 70), h_q=h, seed=25)
    b = data.case.b
    rng = np.random.default_rng(26)
    x = rng.standard_normal((b, d)).astype(np.float32)
    w_q = (rng.standard_normal((d, h, 576)) * d ** -0.5).astype(np.float32)
    w_v = (rng.standard_normal((h, 512, 32)) * 512 ** -0.5).astype(np.float32)
    w_o = (rng.standard_normal((h, 32, d)) * 512 ** -0.5).astype(np.float32)

    def step(x, w_q, kv, bt, sl, w_v, *w_o):
        q = jnp.einsum("bd,dhc->bhc", x, w_q)[:, None].astype(kv.dtype)
        o = jax_mla.mla_decode(q, kv, bt, sl)[:, 0].astype(jnp.float32)
        o = jnp.einsum("bhc,hcv->bhv", o, w_v)
        return jnp.einsum("bhv,hvd->bd", o, w_o[0]) if w_o else o

    arrays = (x, w_q, data.kv_cache, data.block_table, data.seq_lens, w_v)
    m = mode_mesh(mode, (NUM_DEVICES,), ("data",))
    specs = [P("data"), P(), P("data"), P("data"), P("data"), P()]
    fn, args = sharded(step, mode, m, arrays + (w_o,), specs + [P()])
    got = np.asarray(fn(*args))
    want = np.asarray(jax.jit(step)(*arrays, w_o))
    np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)
    assert_no_collectives(fn, *args)

    m2 = mode_mesh(mode, (NUM_DEVICES // 2, 2), ("data", "model"))
    specs2 = [P("data"), P(None, "model"), P("data"), P("data"), P("data"), P("model")]
    fn, args = sharded(step, mode, m2, arrays, specs2)
    got = fn(*args)
    assert tuple(got.sharding.spec)[:2] == ("data", "model"), got.sharding
    np.testing.assert_allclose(np.asarray(got), np.asarray(jax.jit(step)(*arrays)), rtol=2e-2,
                               atol=2e-2)
    assert_no_collectives(fn, *args)


def check_other_layouts_are_resharded(mode):
    """Layouts the rule does not split on (q split on s_q or on the 576 columns; the cache's
    pages split over other axes than the batch) are resharded, never computed wrongly."""
    data = global_data(LENS, seed=14)
    data.q = np.concatenate([data.q, -data.q], axis=1)  # s_q = 2
    m = mode_mesh(mode, (NUM_DEVICES // 2, 2), ("data", "model"))
    want = jax.jit(decode)(*data.args)
    for specs in ([P(None, "model"), P(), P(), P()],
                  [P(None, None, None, "data"), P(), P(), P()],
                  [P("data"), P("model"), P("data"), P("data")],
                  [P("data"), P(("data", "model")), P(), P("model")],
                  [P(), P("data"), P(), P()]):
        fn, args = sharded(decode, mode, m, data.args, specs)
        assert_agree(fn(*args), want)


def check_batch_invariant_under_sharding(mode):
    """batch_invariant=True survives every path: under batch sharding each shard plans its
    requests with the invariant plan (a passed schedule is dropped), so a request's bits are those
    of the unsharded call, over a 16-bit and an FP8 cache; with the heads split an invariant
    schedule is used as passed. Every compiled call carries the chunk."""
    chunk = 256

    def invariant(q, kv, bt, sl, passed=False):
        sched = (jax_mla.decode_schedule(sl, num_heads=q.shape[2], batch_invariant=True,
                                         invariant_chunk=chunk) if passed else None)
        return jax_mla.mla_decode(q, kv, bt, sl, return_lse=True, schedule=sched,
                                  batch_invariant=True, invariant_chunk=chunk)

    def chunk_attrs(fn, args):
        text = fn.lower(*args).compile().as_text()
        calls = [ln for ln in text.splitlines() if 'custom_call_target="jax_mla_decode"' in ln]
        assert calls and all(f"chunk_blocks = {chunk // 64}" in ln for ln in calls), calls
        assert not collectives(text), collectives(text)

    m = mode_mesh(mode, (NUM_DEVICES,), ("data",))
    for make, seed in ((cases.make, 80), (cases.make_fp8, 81)):
        data, _ = sharded_pages_data(NUM_DEVICES, (5, 700, 1500), seed=seed, make=make)
        for passed in (False, True):
            step = functools.partial(invariant, passed=passed)
            want = jax.jit(step)(*data.args)
            fn, args = sharded(step, mode, m, data.args, [P("data")] * 4)
            got = fn(*args)
            for g, w in zip(got, want):
                np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
            chunk_attrs(fn, args)
    data = global_data(LENS[:6], seed=82)
    step = functools.partial(invariant, passed=True)
    fn, args = sharded(step, mode, m, data.args, [P(None, None, "data"), P(), P(), P()])
    assert_agree(fn(*args), jax.jit(step)(*data.args))
    chunk_attrs(fn, args)


def check_update_kv_cache_batch_sharded(mode):
    """update_kv_cache with per-shard pages: each shard writes its own pages, no collective, the
    donated cache aliased to the result; the result equals the unsharded update bit for bit."""
    data, _ = sharded_pages_data(NUM_DEVICES, (5, 70), seed=60)
    rng = np.random.default_rng(61)
    new = rng.standard_normal((data.case.b, 2, cases.HEAD_DIM_QK)).astype(data.kv_cache.dtype)
    # Rewrite each request's last two tokens (length 0 or 1: padding -1 for the missing ones).
    positions = (data.seq_lens[:, None] + np.array([-2, -1], np.int32)).astype(np.int32)
    positions = np.maximum(positions, -1)
    want = jax.jit(jax_mla.update_kv_cache)(data.kv_cache, new, data.block_table, positions)
    m = mode_mesh(mode, (NUM_DEVICES,), ("data",))
    fn, args = sharded(jax_mla.update_kv_cache, mode, m,
                       (data.kv_cache, new, data.block_table, positions), [P("data")] * 4,
                       donate_argnums=0)
    if mode == "auto":
        args[0] = jax.device_put(args[0], NamedSharding(m, P("data")))  # a donatable cache
    text = fn.lower(*args).compile().as_text()
    assert not collectives(text), collectives(text)
    assert re.search(r"input_output_alias=\{ \{\}: \(0, \{\}, may-alias\) \}", text), \
        text.splitlines()[0]
    got = fn(*args)
    assert got.sharding.spec[0] == "data"
    np.testing.assert_array_equal(np.asarray(got).view(np.uint16), np.asarray(want).view(np.uint16))
    assert args[0].is_deleted()


def check_update_kv_cache_replicated_rows(mode):
    """The cache's pages split, the new rows (and block table, positions) replicated: every write
    lands on its page wherever it is (the global scatter), with no collective."""
    data = global_data(LENS, seed=62)
    rng = np.random.default_rng(63)
    new = rng.standard_normal((data.case.b, 1, cases.HEAD_DIM_QK)).astype(data.kv_cache.dtype)
    positions = np.where(data.seq_lens > 0, data.seq_lens - 1, -1)[:, None].astype(np.int32)
    arrays = (data.kv_cache, new, data.block_table, positions)
    want = jax.jit(jax_mla.update_kv_cache)(*arrays)
    m = mode_mesh(mode, (NUM_DEVICES,), ("data",))
    fn, args = sharded(jax_mla.update_kv_cache, mode, m, arrays, [P("data"), P(), P(), P()])
    got = fn(*args)
    assert got.sharding.spec[0] == "data"
    np.testing.assert_array_equal(np.asarray(got).view(np.uint16), np.asarray(want).view(np.uint16))
    text = fn.lower(*args).compile().as_text()
    assert not collectives(text), collectives(text)


def check_update_kv_cache_rank4_cache(mode):
    """A (P, page, 1, row) cache, 16-bit and FP8, pages split with the new rows: the rank-4 form
    of the Auto-axes rule; bit-identical to the unsharded update, no collective."""
    for make, seed in ((cases.make, 64), (cases.make_fp8, 66)):
        data, _ = sharded_pages_data(NUM_DEVICES, (5, 70), rank4=True, seed=seed, make=make)
        assert data.kv_cache.ndim == 4
        rng = np.random.default_rng(seed + 1)
        new = rng.standard_normal((data.case.b, 1, cases.HEAD_DIM_QK)).astype(cases.DTYPES[data.case.dtype])
        positions = np.maximum(data.seq_lens - 1, -1)[:, None].astype(np.int32)
        arrays = (data.kv_cache, new, data.block_table, positions)
        want = np.asarray(jax.jit(jax_mla.update_kv_cache)(*arrays))
        m = mode_mesh(mode, (NUM_DEVICES,), ("data",))
        fn, args = sharded(jax_mla.update_kv_cache, mode, m, arrays, [P("data")] * 4)
        got = fn(*args)
        assert got.sharding.spec[0] == "data" and got.shape == data.kv_cache.shape, got.sharding
        np.testing.assert_array_equal(np.asarray(got).view(np.uint8), want.view(np.uint8))
        assert not collectives(fn.lower(*args).compile().as_text())


def check_page_on_another_shard_is_an_error(mode):
    """With per-shard pages, a request may only read its shard's pages: concrete inputs are
    refused at call time under Explicit axes, traced ones by the kernel (an id outside the shard
    becomes invalid)."""
    data, _ = sharded_pages_data(NUM_DEVICES, (5, 70))
    table = data.block_table.copy()
    table[2, 0] = table[0, 0]  # request 2 (shard 1) points at a page of shard 0
    m = mode_mesh(mode, (NUM_DEVICES,), ("data",))
    fn, args = sharded(decode, mode, m, (data.q, data.kv_cache, table, data.seq_lens),
                       [P("data")] * 4)
    if mode == "explicit":
        try:
            decode(*args)
        except ValueError as e:
            assert f"batch shard 1 of {NUM_DEVICES}" in str(e) and "block_table[2, 0]" in str(e), \
                str(e)
        else:
            raise AssertionError("no error for a page on another shard (eager)")
    if jax.devices()[0].platform == "cpu":
        try:
            jax.block_until_ready(fn(*args))
        except Exception as e:  # noqa: BLE001 - JaxRuntimeError or ValueError by jaxlib version
            assert "block_table" in str(e), str(e)
        else:
            raise AssertionError("no error for a page on another shard (jit)")
    else:
        # On a GPU the block table is read on the device only: the request reading outside its
        # shard gets NaN output and LSE, every other request its normal result (README).
        out, lse = (np.asarray(x, np.float32) for x in fn(*args))
        assert np.isnan(out[2]).all() and np.isnan(lse[2]).all(), "request 2 is not NaN"
        rest = np.arange(data.case.b) != 2
        assert np.isfinite(out[rest]).all(), "a request other than 2 is not finite"
    if mode != "explicit":
        return
    # update_kv_cache: the same rule for the pages written (concrete inputs).
    new = np.zeros((data.case.b, 1, cases.HEAD_DIM_QK), data.kv_cache.dtype)
    pos = np.full((data.case.b, 1), -1, np.int32)
    pos[2, 0] = 0  # only request 2 writes, at position 0: page table[2, 0]
    upd = put(m, (data.kv_cache, new, table, pos), [P("data")] * 4)
    try:
        jax_mla.update_kv_cache(*upd)
    except ValueError as e:
        assert "may only write that shard's pages" in str(e) and "block_table[2, 0]" in str(e), str(e)
    else:
        raise AssertionError("no error for a write to another shard's page")


# ----------------------------------------------------------------------------------------------
# Checks over an FP8 cache (uint8 rows of 656 bytes), in every mode: the Explicit-axes plan, the
# shard_map and the Auto-axes partitioning rules do not look at the cache's dtype or row width
# ----------------------------------------------------------------------------------------------

def check_fp8_batch_sharded_pages_per_shard(mode):
    """Data parallel with per-shard pages of an FP8 cache (rank 3 and rank 4)."""
    m = mode_mesh(mode, (NUM_DEVICES,), ("data",))
    for rank4 in (False, True):
        data, _ = sharded_pages_data(NUM_DEVICES, (5, 70), rank4=rank4, seed=70,
                                     make=cases.make_fp8)
        assert data.kv_cache.dtype == np.uint8
        fn, args = sharded(decode, mode, m, data.args, [P("data")] * 4)
        got = fn(*args)
        assert got[0].sharding.spec[0] == "data", got[0].sharding
        assert_agree(got, jax.jit(decode)(*data.args))
        check_against_reference(data, got)
        assert_no_collectives(fn, *args)


def check_fp8_heads_sharded_and_replicated_cache(mode):
    """Tensor parallel (q on heads), and data parallel over a replicated FP8 cache."""
    data = global_data(LENS[:6], seed=71, make=cases.make_fp8)
    m = mode_mesh(mode, (NUM_DEVICES,), ("model",))
    fn, args = sharded(decode, mode, m, data.args, [P(None, None, "model"), P(), P(), P()])
    got = fn(*args)
    assert got[0].sharding.spec[2] == "model", got[0].sharding
    assert_agree(got, jax.jit(decode)(*data.args))
    check_against_reference(data, got)
    assert_no_collectives(fn, *args)
    data = global_data(LENS, seed=72, make=cases.make_fp8)
    m = mode_mesh(mode, (NUM_DEVICES,), ("data",))
    fn, args = sharded(decode, mode, m, data.args, [P("data"), P(), P("data"), P("data")])
    got = fn(*args)
    assert_agree(got, jax.jit(decode)(*data.args))
    check_against_reference(data, got)
    assert_no_collectives(fn, *args)


def check_fp8_update_kv_cache_batch_sharded(mode):
    """update_kv_cache into a page-sharded FP8 cache (576-wide float rows quantized into 656-byte
    ones): per-shard writes, no collective, donated and aliased, bit-identical to the unsharded
    update; then a sharded decode reads them. Then the rows replicated (the global scatter)."""
    data, _ = sharded_pages_data(NUM_DEVICES, (5, 70), seed=73, make=cases.make_fp8)
    rng = np.random.default_rng(74)
    new = rng.standard_normal((data.case.b, 2, cases.HEAD_DIM_QK)).astype(np.float32)
    positions = np.maximum(data.seq_lens[:, None] + np.array([-2, -1], np.int32), -1).astype(np.int32)
    arrays = (data.kv_cache, new, data.block_table, positions)
    want = np.asarray(jax.jit(jax_mla.update_kv_cache)(*arrays))
    m = mode_mesh(mode, (NUM_DEVICES,), ("data",))
    fn, args = sharded(jax_mla.update_kv_cache, mode, m, arrays, [P("data")] * 4, donate_argnums=0)
    if mode == "auto":
        args[0] = jax.device_put(args[0], NamedSharding(m, P("data")))  # a donatable cache
    text = fn.lower(*args).compile().as_text()
    assert not collectives(text), collectives(text)
    assert re.search(r"input_output_alias=\{ \{\}: \(0, \{\}, may-alias\) \}", text), \
        text.splitlines()[0]
    got = fn(*args)
    assert got.sharding.spec[0] == "data" and got.dtype == np.uint8, (got.sharding, got.dtype)
    np.testing.assert_array_equal(np.asarray(got), want)
    assert args[0].is_deleted()
    dfn, dargs = sharded(decode, mode, m, (data.q, want, data.block_table, data.seq_lens),
                         [P("data")] * 4)
    assert_agree(dfn(*dargs), decode(data.q, want, data.block_table, data.seq_lens))

    fn, args = sharded(jax_mla.update_kv_cache, mode, m, arrays, [P("data"), P(), P(), P()])
    got = fn(*args)
    assert got.sharding.spec[0] == "data" and got.dtype == np.uint8, (got.sharding, got.dtype)
    np.testing.assert_array_equal(np.asarray(got), want)
    assert not collectives(fn.lower(*args).compile().as_text())


def check_shard_map(mode):
    """shard_map written by the caller: inside it mla_decode sees one shard's arrays."""
    _shard_map_checks(mode, cases.make)


def check_fp8_shard_map(mode):
    """check_shard_map over an FP8 cache."""
    _shard_map_checks(mode, cases.make_fp8)


def _shard_map_checks(mode, make):
    data, shards = sharded_pages_data(NUM_DEVICES, (5, 70), seed=30, make=make)
    m = mode_mesh(mode, (NUM_DEVICES,), ("data",))
    # Per shard the block table holds LOCAL page ids: build the global (concatenated) local tables.
    local_tables = np.concatenate([d.block_table for d in shards])

    def step(q, kv, bt, sl):
        # Inside shard_map mla_decode sees one shard's arrays; the schedule is the shard's own.
        sched = jax_mla.decode_schedule(sl, num_heads=16)
        return decode(q, kv, bt, sl, sched)

    smap = jax.shard_map(step, mesh=m, in_specs=(P("data"),) * 4, out_specs=(P("data"), P("data")))
    fn, args = sharded(smap, mode, m, (data.q, data.kv_cache, local_tables, data.seq_lens),
                       [P("data")] * 4)
    got = fn(*args)
    want = [decode(*d.args) for d in shards]
    assert_agree(got, [np.concatenate([w[i] for w in want]) for i in range(2)])
    check_against_reference(data, got)
    assert_no_collectives(fn, *args)

    heads = jax.shard_map(decode, mesh=m, in_specs=(P(None, None, "data"), P(), P(), P()),
                          out_specs=(P(None, None, "data"), P(None, None, "data")))
    hdata = global_data(LENS[:4], seed=31, make=make)
    fn, hargs = sharded(heads, mode, m, hdata.args, [P(None, None, "data"), P(), P(), P()])
    assert_agree(fn(*hargs), decode(*hdata.args))
    assert_no_collectives(fn, *hargs)


def check_auto_axes_under_gspmd_propagation():
    """Auto axes with GSPMD instead of Shardy propagating the shardings (deprecated in XLA, still
    selectable): the op's infer_sharding_from_operands callback serves it the same way."""
    shardy = jax.config.jax_use_shardy_partitioner
    jax.config.update("jax_use_shardy_partitioner", False)
    try:
        for mode in ("auto", "committed"):
            check_batch_sharded_pages_per_shard(mode)
            check_heads_sharded(mode)
            check_update_kv_cache_batch_sharded(mode)
            check_batch_invariant_under_sharding(mode)
            check_fp8_update_kv_cache_batch_sharded(mode)
    finally:
        jax.config.update("jax_use_shardy_partitioner", shardy)


# ----------------------------------------------------------------------------------------------
# Checks: export
# ----------------------------------------------------------------------------------------------

def check_export_of_a_sharded_step():
    """A data-parallel step with explicit shardings exports, serializes and runs."""
    data, _ = sharded_pages_data(NUM_DEVICES, (5, 70), seed=50)
    m = mesh((NUM_DEVICES,), ("data",))
    args = put(m, data.args, [P("data")] * 4)
    fn = jax.jit(decode)
    exp = jax.export.export(fn, disabled_checks=jax_mla.export_disabled_checks())(*args)
    assert exp.nr_devices == NUM_DEVICES
    restored = jax.export.deserialize(exp.serialize())
    got = restored.call(*args)
    assert_agree(got, fn(*data.args))
    call = jax.jit(restored.call)
    assert_no_collectives(call, *args)


def check_export_under_auto_axes_is_refused():
    """Auto axes: mla_decode's partitioning is a compile-time callback jax.export cannot carry,
    so a multi-device export of it fails, naming the ways that export, instead of replicating
    the op. update_kv_cache exports as its plain scatter."""
    data, _ = sharded_pages_data(NUM_DEVICES, (5, 70), seed=51)
    m = mesh((NUM_DEVICES,), ("data",), auto=True)
    shardings = tuple(NamedSharding(m, P("data")) for _ in range(4))
    for fn in (decode, jax.jit(decode)):
        try:
            jax.export.export(jax.jit(fn, in_shardings=shardings),
                              disabled_checks=jax_mla.export_disabled_checks())(*data.args)
        except ValueError as e:
            assert "Explicit" in str(e) and "shard_map" in str(e), str(e)
        else:
            raise AssertionError("an export under Auto axes did not fail")
    positions = np.maximum(data.seq_lens - 1, -1)[:, None].astype(np.int32)
    new = np.ones((data.case.b, 1, cases.HEAD_DIM_QK), data.kv_cache.dtype)
    upd = (data.kv_cache, new, data.block_table, positions)
    exp = jax.export.export(jax.jit(jax_mla.update_kv_cache, in_shardings=shardings))(*upd)
    restored = jax.export.deserialize(exp.serialize())
    got = restored.call(*put(m, upd, [P("data")] * 4))
    np.testing.assert_array_equal(np.asarray(got).view(np.uint16),
                                  np.asarray(jax_mla.update_kv_cache(*upd)).view(np.uint16))


def _checks():
    """{name: check}: the mode-dependent checks once per mode ("name[mode]"), then the others."""
    found = {}
    for name, fn in sorted(globals().items()):
        if not name.startswith("check_") or name == "check_against_reference":
            continue
        if "mode" in inspect.signature(fn).parameters:
            for mode in MODES:
                found[f"{name[len('check_'):]}[{mode}]"] = functools.partial(fn, mode)
        else:
            found[name[len("check_"):]] = fn
    return found


CHECKS = _checks()


def main(argv):
    out_path, names = argv[0], argv[1:] or list(CHECKS)
    assert jax.device_count() == NUM_DEVICES, (
        f"needs {NUM_DEVICES} devices (XLA_FLAGS=--xla_force_host_platform_device_count="
        f"{NUM_DEVICES}), got {jax.device_count()}")
    results = {}
    for name in names:
        t0 = time.perf_counter()
        try:
            CHECKS[name]()
            results[name] = {"ok": True, "error": ""}
        except Exception:  # noqa: BLE001 - reported to the test
            results[name] = {"ok": False, "error": traceback.format_exc()}
        results[name]["seconds"] = round(time.perf_counter() - t0, 2)
        print(f"{name}: {'ok' if results[name]['ok'] else 'FAILED'} "
              f"({results[name]['seconds']} s)", flush=True)
    with open(out_path, "w") as f:
        json.dump(results, f, indent=1)
    return 0 if all(r["ok"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
