"""Multi-device checks of jax_mla.mla_decode, run by tests/api/test_sharding.py in a subprocess.

They need 8 CPU devices, i.e. XLA_FLAGS=--xla_force_host_platform_device_count=8 before jax
initialises, which a pytest process that already imported jax cannot get; hence this script:

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python3 tests/api/sharding_worker.py OUT.json [NAME ...]

On a machine with several GPUs (issue #8) the same checks run on them with
JAX_MLA_SHARDING_DEVICES=N (an even number; default 8) and no XLA_FLAGS: `benchmarks/device_run.sh
multigpu` does that with N = the GPU count.

runs the checks (all, or the named ones) and writes {name: {"ok": bool, "error": str, "seconds": float}}
to OUT.json. Each check compares sharded results with the unsharded call and the reference, and
looks for collectives in the compiled HLO.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import traceback

# cases.py is in tests/, one folder up.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
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
# Checks (explicit sharding under plain jit)
# ----------------------------------------------------------------------------------------------

def check_batch_sharded_pages_per_shard():
    """Data parallel: q, cache pages, block table and lengths split over the devices."""
    data, _ = sharded_pages_data(NUM_DEVICES, (5, 70))
    m = mesh((NUM_DEVICES,), ("data",))
    args = put(m, data.args, [P("data")] * 4)
    fn = jax.jit(decode)
    got = fn(*args)
    assert got[0].sharding.spec[0] == "data" and got[1].sharding.spec[0] == "data", got[0].sharding
    assert_agree(got, fn(*data.args))
    check_against_reference(data, got)
    assert_no_collectives(fn, *args)
    # Eager (not jitted) calls take the same path.
    assert_agree(decode(*args), got)


def check_batch_sharded_replicated_cache():
    """Data parallel over requests reading one replicated cache with global page ids."""
    data = global_data(LENS, seed=11)
    m = mesh((NUM_DEVICES,), ("data",))
    args = put(m, data.args, [P("data"), P(), P("data"), P("data")])
    fn = jax.jit(decode)
    got = fn(*args)
    assert_agree(got, fn(*data.args))
    check_against_reference(data, got)
    assert_no_collectives(fn, *args)


def check_heads_sharded():
    """Tensor parallel: q split on its head axis; cache, table and lengths replicated."""
    data = global_data(LENS[:6], h_q=16, seed=12)
    m = mesh((NUM_DEVICES,), ("model",))
    args = put(m, data.args, [P(None, None, "model"), P(), P(), P()])
    fn = jax.jit(decode)
    got = fn(*args)
    assert got[0].sharding.spec[2] == "model" and got[1].sharding.spec[2] == "model"
    assert_agree(got, fn(*data.args))
    check_against_reference(data, got)
    assert_no_collectives(fn, *args)


def check_batch_and_heads_2d_mesh_rank4_cache():
    """N/2-way data parallel x 2-way tensor parallel, per-shard pages, a (P, page, 1, 576) cache."""
    data, _ = sharded_pages_data(NUM_DEVICES // 2, (5, 70, 33), h_q=8, s_q=2, rank4=True, seed=20)
    m = mesh((NUM_DEVICES // 2, 2), ("data", "model"))
    args = put(m, data.args, [P("data", None, "model"), P("data"), P("data"), P("data")])
    fn = jax.jit(decode)
    got = fn(*args)
    assert tuple(got[0].sharding.spec)[:3] == ("data", None, "model")
    assert_agree(got, fn(*data.args))
    check_against_reference(data, got)
    assert_no_collectives(fn, *args)


def check_schedule_under_batch_sharding():
    """A decode_schedule made for the global batch is dropped under batch sharding; each shard
    plans its own requests inside the op (schedule operand of shape (0,)), with no collective."""
    data, _ = sharded_pages_data(NUM_DEVICES, (5, 130))
    m = mesh((NUM_DEVICES,), ("data",))
    args = put(m, data.args, [P("data")] * 4)

    def two_layers(q, kv, bt, sl):
        sched = jax_mla.decode_schedule(sl, num_heads=16, num_parts=3)
        o1, l1 = decode(q, kv, bt, sl, sched)
        o2, l2 = decode(-q, kv, bt, sl, sched)  # another layer's query (no CSE)
        return o1, l1, o2, l2

    fn = jax.jit(two_layers)
    got = fn(*args)
    want = fn(*data.args)
    assert_agree(got[:2], want[:2])
    assert_agree(got[2:], want[2:])
    text = assert_no_collectives(fn, *args)
    assert "jax_mla_decode_schedule" not in text, "the unused global schedule was not removed"
    calls = [ln for ln in text.splitlines() if 'custom_call_target="jax_mla_decode"' in ln]
    assert len(calls) == 2 and all("s32[0]" in ln for ln in calls), calls
    assert 'num_parts = 3' in fn.lower(*args).as_text(), "the schedule's num_parts was not kept"


def check_schedule_under_heads_sharding():
    """With only the heads split every shard has the whole batch: the passed schedule is used."""
    data = global_data(LENS[:6], seed=13)
    m = mesh((NUM_DEVICES,), ("model",))
    args = put(m, data.args, [P(None, None, "model"), P(), P(), P()])

    def two_layers(q, kv, bt, sl):
        sched = jax_mla.decode_schedule(sl, num_heads=16, num_parts=5)
        return decode(q, kv, bt, sl, sched) + decode(-q, kv, bt, sl, sched)

    fn = jax.jit(two_layers)
    got = fn(*args)
    assert_agree(got[:2], fn(*data.args)[:2])
    check_against_reference(data, got[:2])
    text = assert_no_collectives(fn, *args)
    assert text.count('custom_call_target="jax_mla_decode_schedule"') == 1
    size = 5 * 8 + 2 * 6 + 3  # schedule_size(b=6, num_parts=5)
    calls = [ln for ln in text.splitlines() if 'custom_call_target="jax_mla_decode"' in ln]
    assert len(calls) == 2 and all(f"s32[{size}]" in ln for ln in calls), calls


def check_page_on_another_shard_is_an_error():
    """With per-shard pages, a request may only read its shard's pages: concrete inputs are
    refused at call time, traced ones by the kernel (an id outside the shard becomes invalid)."""
    data, _ = sharded_pages_data(NUM_DEVICES, (5, 70))
    table = data.block_table.copy()
    table[2, 0] = table[0, 0]  # request 2 (shard 1) points at a page of shard 0
    m = mesh((NUM_DEVICES,), ("data",))
    args = put(m, (data.q, data.kv_cache, table, data.seq_lens), [P("data")] * 4)
    try:
        decode(*args)
    except ValueError as e:
        assert f"batch shard 1 of {NUM_DEVICES}" in str(e) and "block_table[2, 0]" in str(e), str(e)
    else:
        raise AssertionError("no error for a page on another shard (eager)")
    if jax.devices()[0].platform == "cpu":
        try:
            jax.block_until_ready(jax.jit(decode)(*args))
        except Exception as e:  # noqa: BLE001 - JaxRuntimeError or ValueError by jaxlib version
            assert "block_table" in str(e), str(e)
        else:
            raise AssertionError("no error for a page on another shard (jit)")
    else:
        # On a GPU the block table is read on the device only: the request reading outside its
        # shard gets NaN output and LSE, every other request its normal result (README).
        out, lse = (np.asarray(x, np.float32) for x in jax.jit(decode)(*args))
        assert np.isnan(out[2]).all() and np.isnan(lse[2]).all(), "request 2 is not NaN"
        rest = np.arange(data.case.b) != 2
        assert np.isfinite(out[rest]).all(), "a request other than 2 is not finite"
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


def check_update_kv_cache_batch_sharded():
    """update_kv_cache with per-shard pages: each shard writes its own pages, no collective, the
    donated cache aliased to the result; the result equals the unsharded update bit for bit."""
    data, _ = sharded_pages_data(NUM_DEVICES, (5, 70), seed=60)
    rng = np.random.default_rng(61)
    new = rng.standard_normal((data.case.b, 2, cases.HEAD_DIM_QK)).astype(data.kv_cache.dtype)
    # Rewrite each request's last two tokens (length 0 or 1: padding -1 for the missing ones).
    positions = (data.seq_lens[:, None] + np.array([-2, -1], np.int32)).astype(np.int32)
    positions = np.maximum(positions, -1)
    want = jax.jit(jax_mla.update_kv_cache)(data.kv_cache, new, data.block_table, positions)
    m = mesh((NUM_DEVICES,), ("data",))
    args = put(m, (data.kv_cache, new, data.block_table, positions), [P("data")] * 4)
    fn = jax.jit(jax_mla.update_kv_cache, donate_argnums=0)
    compiled = fn.lower(*args).compile()
    text = compiled.as_text()
    assert not collectives(text), collectives(text)
    assert re.search(r"input_output_alias=\{ \{\}: \(0, \{\}, may-alias\) \}", text), \
        text.splitlines()[0]
    got = fn(*args)
    assert got.sharding.spec[0] == "data"
    np.testing.assert_array_equal(np.asarray(got).view(np.uint16), np.asarray(want).view(np.uint16))
    assert args[0].is_deleted()


# ----------------------------------------------------------------------------------------------
# Checks over an FP8 cache (uint8 rows of 656 bytes): the plan and the shard_map do not look at the
# cache's dtype or row width
# ----------------------------------------------------------------------------------------------

def check_fp8_batch_sharded_pages_per_shard():
    """Data parallel with per-shard pages of an FP8 cache (rank 3 and rank 4)."""
    m = mesh((NUM_DEVICES,), ("data",))
    for rank4 in (False, True):
        data, _ = sharded_pages_data(NUM_DEVICES, (5, 70), rank4=rank4, seed=70,
                                     make=cases.make_fp8)
        assert data.kv_cache.dtype == np.uint8
        args = put(m, data.args, [P("data")] * 4)
        fn = jax.jit(decode)
        got = fn(*args)
        assert got[0].sharding.spec[0] == "data"
        assert_agree(got, fn(*data.args))
        check_against_reference(data, got)
        assert_no_collectives(fn, *args)


def check_fp8_heads_sharded_and_replicated_cache():
    """Tensor parallel (q on heads), and data parallel over a replicated FP8 cache."""
    data = global_data(LENS[:6], seed=71, make=cases.make_fp8)
    m = mesh((NUM_DEVICES,), ("model",))
    args = put(m, data.args, [P(None, None, "model"), P(), P(), P()])
    fn = jax.jit(decode)
    got = fn(*args)
    assert got[0].sharding.spec[2] == "model"
    assert_agree(got, fn(*data.args))
    check_against_reference(data, got)
    assert_no_collectives(fn, *args)
    data = global_data(LENS, seed=72, make=cases.make_fp8)
    m = mesh((NUM_DEVICES,), ("data",))
    args = put(m, data.args, [P("data"), P(), P("data"), P("data")])
    got = fn(*args)
    assert_agree(got, fn(*data.args))
    check_against_reference(data, got)
    assert_no_collectives(fn, *args)


def check_fp8_update_kv_cache_batch_sharded():
    """update_kv_cache into a page-sharded FP8 cache: per-shard quantized writes, no collective,
    donated and aliased, bit-identical to the unsharded update; then a sharded decode reads them."""
    data, _ = sharded_pages_data(NUM_DEVICES, (5, 70), seed=73, make=cases.make_fp8)
    rng = np.random.default_rng(74)
    new = rng.standard_normal((data.case.b, 2, cases.HEAD_DIM_QK)).astype(np.float32)
    positions = np.maximum(data.seq_lens[:, None] + np.array([-2, -1], np.int32), -1).astype(np.int32)
    want = np.asarray(jax.jit(jax_mla.update_kv_cache)(data.kv_cache, new, data.block_table, positions))
    m = mesh((NUM_DEVICES,), ("data",))
    args = put(m, (data.kv_cache, new, data.block_table, positions), [P("data")] * 4)
    fn = jax.jit(jax_mla.update_kv_cache, donate_argnums=0)
    text = fn.lower(*args).compile().as_text()
    assert not collectives(text), collectives(text)
    assert re.search(r"input_output_alias=\{ \{\}: \(0, \{\}, may-alias\) \}", text), \
        text.splitlines()[0]
    got = fn(*args)
    assert got.sharding.spec[0] == "data" and got.dtype == np.uint8
    np.testing.assert_array_equal(np.asarray(got), want)
    assert args[0].is_deleted()
    dargs = put(m, (data.q, got, data.block_table, data.seq_lens), [P("data")] * 4)
    assert_agree(jax.jit(decode)(*dargs), decode(data.q, want, data.block_table, data.seq_lens))


# ----------------------------------------------------------------------------------------------
# Checks (shard_map, auto meshes, export)
# ----------------------------------------------------------------------------------------------

def _shard_map_checks(auto, make=cases.make):
    data, shards = sharded_pages_data(NUM_DEVICES, (5, 70), seed=30, make=make)
    m = mesh((NUM_DEVICES,), ("data",), auto=auto)
    # Per shard the block table holds LOCAL page ids: build the global (concatenated) local tables.
    local_tables = np.concatenate([d.block_table for d in shards])

    def step(q, kv, bt, sl):
        # Inside shard_map mla_decode sees one shard's arrays; the schedule is the shard's own.
        sched = jax_mla.decode_schedule(sl, num_heads=16)
        return decode(q, kv, bt, sl, sched)

    fn = jax.jit(jax.shard_map(step, mesh=m, in_specs=(P("data"),) * 4,
                               out_specs=(P("data"), P("data"))))
    args = (data.q, data.kv_cache, local_tables, data.seq_lens)
    if not auto:  # explicit axes: shard_map wants inputs already split like its in_specs
        args = put(m, args, [P("data")] * 4)
    got = fn(*args)
    want = [decode(*d.args) for d in shards]
    assert_agree(got, [np.concatenate([w[i] for w in want]) for i in range(2)])
    check_against_reference(data, got)
    assert_no_collectives(fn, *args)

    heads = jax.jit(jax.shard_map(decode, mesh=m, in_specs=(P(None, None, "data"), P(), P(), P()),
                                  out_specs=(P(None, None, "data"), P(None, None, "data"))))
    hdata = global_data(LENS[:4], seed=31, make=make)
    hargs = hdata.args if auto else put(m, hdata.args, [P(None, None, "data"), P(), P(), P()])
    got = heads(*hargs)
    assert_agree(got, decode(*hdata.args))
    assert_no_collectives(heads, *hargs)


def check_shard_map_explicit_mesh():
    _shard_map_checks(auto=False)


def check_shard_map_auto_mesh():
    _shard_map_checks(auto=True)


def check_fp8_shard_map_explicit_mesh():
    _shard_map_checks(auto=False, make=cases.make_fp8)


def check_auto_mesh_plain_jit_is_correct():
    """Auto axes are invisible at trace time: the op runs replicated (XLA gathers its operands).
    Only the values are checked here; README documents the collectives."""
    data = global_data(LENS, seed=40)
    m = mesh((NUM_DEVICES,), ("data",), auto=True)
    args = put(m, data.args, [P("data"), P(), P("data"), P("data")])
    fn = jax.jit(decode)
    assert_agree(fn(*args), fn(*data.args))


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


CHECKS = {name[len("check_"):]: fn for name, fn in sorted(globals().items())
          if name.startswith("check_") and callable(fn) and name != "check_against_reference"}


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
