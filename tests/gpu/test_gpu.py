"""The CUDA kernels (jax_mla.mla_decode on a GPU) against the fp32 reference computed on the CPU.

Every test here is marked `gpu`: skipped without a GPU, a failure instead when
JAX_MLA_REQUIRE_GPU=1. To add cases, append Case(...) objects to EXTRA_CASES or LARGE_CASES, or
set JAX_MLA_GPU_SWEEP=N for N random cases instead of the default number.

The kernel tests run twice: with kernel="auto" (the device's own kernel: sm90 on an H100/H200)
and with the portable kernel forced (kernel="portable"), which is how the portable kernel is tested
on Hopper. JAX_MLA_GPU_KERNELS=auto (or portable) runs one of them only.
"""

from __future__ import annotations

import functools
import os

import jax
import numpy as np
import pytest

import cases
import jax_mla
from jax_mla import _ext
from test_split_plan import check_pieces_plan

pytestmark = pytest.mark.gpu

GPU_PAGE_SIZES = (16, 32, 64, 128, 256)
SWEEP = cases.random_sweep(int(os.environ.get("JAX_MLA_GPU_SWEEP", "48")), master_seed=3,
                           page_sizes=GPU_PAGE_SIZES, heads=(1, 3, 16, 64, 128), max_s_q=4,
                           budget=4_000_000)
EXTRA_CASES: list[cases.Case] = [
    cases.Case(lens=(300, 5), s_q=8, h_q=128, page_size=64, causal=True, seed=9001),  # rows = 1024
    cases.Case(lens=(0,) * 5 + (64,), h_q=16, page_size=16, seed=9002),
]
# Production-like shapes (DeepSeek-V3: 128 heads, or 16 per GPU at TP8).
LARGE_CASES: list[cases.Case] = [
    cases.Case(lens=(4096,) * 32, h_q=128, page_size=64, extra_pages=8, seed=9101),
    cases.Case(lens=(8192,) * 64, h_q=16, page_size=64, extra_pages=8, seed=9102),
    cases.Case(lens=(32768,), h_q=128, page_size=64, seed=9103),
    cases.Case(lens=(4096,) * 16, s_q=2, h_q=128, page_size=64, causal=True, seed=9104),
    cases.Case(lens=tuple(int(x) for x in np.random.default_rng(9105).integers(1, 9128, 64)),
               h_q=128, page_size=64, seed=9105),
    # The SM90 issue's larger cases: b = 256, a 128K context, s_q = 4 causal.
    cases.Case(lens=(1024,) * 256, h_q=16, page_size=64, extra_pages=8, seed=9106),
    cases.Case(lens=(131072,), h_q=128, page_size=256, seed=9107),
    cases.Case(lens=(2048,) * 8, s_q=4, h_q=128, page_size=128, causal=True, seed=9108),
]
CASES = cases.edge_cases(GPU_PAGE_SIZES) + SWEEP + EXTRA_CASES
KERNELS = tuple(os.environ.get("JAX_MLA_GPU_KERNELS", "auto,portable").split(","))


def gpu():
    return jax.devices("gpu")[0]


def cpu():
    return jax.devices("cpu")[0]


def run_gpu(data, **overrides):
    kw = dict(softmax_scale=data.case.softmax_scale, causal=data.case.causal, return_lse=True)
    kw.update(overrides)
    args = [jax.device_put(x, gpu()) for x in data.args]
    with jax.default_device(gpu()):
        out, lse = jax_mla.mla_decode(*args, **kw)
    assert out.devices() == {gpu()}
    return np.asarray(out), np.asarray(lse)


def reference_on_cpu(data, **overrides):
    with jax.default_device(cpu()):
        return cases.reference(data, **overrides)


@functools.lru_cache(maxsize=1)
def prepared(case):
    """The case's data and its CPU reference, kept for the next kernel's run of the same case
    (the kernel parameter varies fastest, so each case is built and referenced once)."""
    data = cases.make(case)
    return data, reference_on_cpu(data)


def check(data, out, lse, ref=None):
    case = data.case
    assert out.shape == (case.b, case.s_q, case.h_q, 512) and out.dtype == np.dtype(case.dtype)
    assert lse.shape == (case.b, case.s_q, case.h_q) and lse.dtype == np.float32
    cases.assert_close_rel_l2(out, lse, *(reference_on_cpu(data) if ref is None else ref), out_tol=1e-2,
                              lse_tol=1e-3)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_gpu_kernel_matches_reference(case, kernel):
    data, ref = prepared(case)
    check(data, *run_gpu(data, kernel=kernel), ref=ref)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("case", LARGE_CASES, ids=lambda c: c.id)
def test_gpu_kernel_large(case, kernel):
    data, ref = prepared(case)
    check(data, *run_gpu(data, kernel=kernel), ref=ref)


def test_gpu_build_has_cuda():
    assert _ext.has_cuda(), "jax sees a GPU but jax_mla._ext was built without CUDA"
    assert "CUDA" in _ext.registrations()
    assert _ext.cuda_sm_count() > 0


@pytest.mark.parametrize("kernel", KERNELS)
def test_identical_calls_are_bit_identical(kernel):
    data = cases.make(cases.Case(lens=(3000, 17, 0, 640), s_q=2, h_q=64, causal=True, seed=9201))
    a = run_gpu(data, kernel=kernel)
    b = run_gpu(data, kernel=kernel)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.view(np.uint8), y.view(np.uint8))


@pytest.mark.parametrize("kernel", KERNELS)
def test_precomputed_schedule_and_num_parts(kernel):
    data = cases.make(cases.Case(lens=(0, 1, 700, 64, 2000, 129, 3, 0), s_q=2, h_q=16,
                                 page_size=16, causal=True, seed=9202))
    sl = jax.device_put(data.seq_lens, gpu())
    in_op = run_gpu(data, kernel=kernel)
    with jax.default_device(gpu()):
        default = jax_mla.decode_schedule(sl, num_heads=16, seq_q=2)
    # The device scheduler builds exactly the host plan.
    num_parts = (default.shape[0] - 2 * data.case.b - 3) // 8  # schedule_size = 8 parts + 2 b + 3
    assert _ext.testing.schedule_size(data.case.b, num_parts) == default.shape[0]
    np.testing.assert_array_equal(np.asarray(default), _ext.testing.plan_schedule(data.seq_lens, num_parts))
    with_default = run_gpu(data, schedule=default, kernel=kernel)
    for x, y in zip(in_op, with_default):
        np.testing.assert_array_equal(x, y)
    for parts in (1, 7, 132):
        with jax.default_device(gpu()):
            sched = jax_mla.decode_schedule(sl, num_heads=16, seq_q=2, num_parts=parts)
        np.testing.assert_array_equal(np.asarray(sched), _ext.testing.plan_schedule(data.seq_lens, parts))
        check(data, *run_gpu(data, schedule=sched, kernel=kernel))


@pytest.mark.parametrize("page", [8, 48])
def test_unsupported_page_size_is_a_clear_error(page):
    data = cases.make(cases.Case(lens=(100, 3), h_q=16, page_size=page, seed=9203))
    with pytest.raises(ValueError, match="power-of-two page_size"):
        run_gpu(data)


@pytest.mark.parametrize("kernel", KERNELS)
def test_jit_and_vmap_on_gpu(kernel):
    base = cases.Case(lens=(0, 5, 130, 64), s_q=2, h_q=16, page_size=16, causal=True, seed=9204)
    datas = [cases.make(base.replace(seed=9204 + v)) for v in range(3)]
    stacked = [jax.device_put(np.stack(xs), gpu()) for xs in zip(*(d.args for d in datas))]
    fn = jax.jit(jax.vmap(lambda *a: jax_mla.mla_decode(*a, causal=True, return_lse=True, kernel=kernel)))
    out, lse = fn(*stacked)
    for v, d in enumerate(datas):
        check(d, np.asarray(out[v]), np.asarray(lse[v]))


@pytest.mark.parametrize("kernel", KERNELS)
def test_bad_page_ids_and_lengths_give_nan_for_that_request_only(kernel):
    """On the GPU the block table is only read on the device: a page id outside the cache, or a
    length the table cannot hold (seen only at run time under jit), makes that request's output and
    LSE NaN instead of reading memory it must not. Other requests are unaffected."""
    data = cases.make(cases.Case(lens=(300, 200, 100), h_q=16, page_size=64, seed=9301))
    q, kv, bt, sl = (np.array(x) for x in data.args)
    num_pages = kv.shape[0]
    bt[1, 2] = num_pages + 5          # request 1 reads its 3rd page: out of range
    sl_bad = sl.copy()
    sl_bad[2] = bt.shape[1] * 64 + 1  # request 2: longer than its block-table row holds
    fn = jax.jit(lambda *a: jax_mla.mla_decode(*a, return_lse=True, kernel=kernel))
    out, lse = (np.asarray(x) for x in fn(*[jax.device_put(x, gpu()) for x in (q, kv, bt, sl_bad)]))
    assert np.isnan(out[1].astype(np.float32)).all() and np.isnan(lse[1]).all()
    assert np.isnan(out[2].astype(np.float32)).all() and np.isnan(lse[2]).all()
    ref_out, ref_lse = reference_on_cpu(data)
    cases.assert_close_rel_l2(out[:1], lse[:1], np.asarray(ref_out)[:1], np.asarray(ref_lse)[:1],
                              out_tol=1e-2, lse_tol=1e-3)


# ----------------------------------------------------------------------------------------------
# The device scheduler and the combine list (cuda/common/scheduler.cu, combine.cu)
# ----------------------------------------------------------------------------------------------

def device_schedule(seq_lens, num_parts):
    """The device scheduler's array."""
    with jax.default_device(gpu()):
        sched = jax_mla.decode_schedule(jax.device_put(np.asarray(seq_lens, np.int32), gpu()),
                                        num_heads=16, num_parts=num_parts)
    return np.asarray(sched)


def plan_splits(seq_lens, num_parts):
    """Splits per request of the host plan."""
    sched = np.asarray(_ext.testing.plan_schedule(np.asarray(seq_lens, np.int32), num_parts))
    return np.diff(sched[num_parts * 8:num_parts * 8 + len(seq_lens) + 1])


# Batch sizes at and around every change of the scheduler's CTA shape (128, 1024) and its limit.
SCHEDULE_BATCHES = (1, 2, 31, 32, 33, 127, 128, 129, 255, 1000, 1024, 1025, 4097, 16384)


@pytest.mark.parametrize("b", SCHEDULE_BATCHES)
def test_device_schedule_equals_host_plan(b):
    """The device scheduler writes exactly the host plan (parts, split offsets, combine list) for
    random, all-empty, half-empty, uniform (with and without empty requests), one-long and
    few-requests batches; the few requests (at most 40 non-empty ones) are where pieces apply and
    their search runs (scheduler.h), the others mostly take the line."""
    rng = np.random.default_rng(9400 + b)
    kinds = np.array([0, 1, 63, 64, 65, 300, 1000, 4096, 30000, 131072])
    batches = {
        "random": np.where(rng.random(b) < 0.5, rng.choice(kinds, b), rng.integers(0, 20000, b)),
        "all_empty": np.zeros(b),
        "half_empty": np.where(rng.random(b) < 0.5, 0, rng.integers(1, 9000, b)),
        "uniform": np.full(b, 4096),  # whole-request parts (scheduler.h part_width) where they fit
        "uniform_with_empty": np.where(np.arange(b) % 7 == 3, 0, 1000),
        "one_long": np.concatenate([[131072], rng.choice([0, 64], b - 1)]),
        "few": np.where(rng.permutation(b) < 40, rng.choice(kinds, b), 0),
    }
    for name, lens in batches.items():
        lens = lens.astype(np.int32)
        for num_parts in (1, 7, 66, 132, 1000):
            np.testing.assert_array_equal(device_schedule(lens, num_parts), _ext.testing.plan_schedule(lens, num_parts),
                                          err_msg=f"{name} b={b} num_parts={num_parts}")


def assert_rows_close(data, out, lse, tol=2e-2):
    """Every query row on its own (a wrong weight or a missing split of one row must not hide in
    the global error): relative L2 error of out per row, and the lse, against the reference."""
    ref_out, ref_lse = reference_on_cpu(data)
    out = np.asarray(out, np.float64).reshape(-1, 512)
    ref_out = np.asarray(ref_out).reshape(-1, 512)
    norm = np.linalg.norm(ref_out, axis=1)
    keys = norm > 0
    err = np.linalg.norm(out - ref_out, axis=1)
    assert (err[~keys] == 0).all()
    worst = (err[keys] / norm[keys]).max(initial=0.0)
    assert worst <= tol, f"worst row relative L2 error {worst:.3g} > {tol}"
    np.testing.assert_allclose(np.asarray(lse).ravel(), np.asarray(ref_lse).ravel(), rtol=1e-3)


def assert_bit_identical(a, b):
    for x, y in zip(a, b):
        np.testing.assert_array_equal(np.asarray(x).view(np.uint8), np.asarray(y).view(np.uint8))


# (case, num_parts, what the plan must contain)
MANY_SPLIT_CASES = [
    # One request cut into 129 pieces of 16 blocks: more than one round (8 warps x 16 splits) per row.
    (cases.Case(lens=(132096,), h_q=128, page_size=64, seed=9501), 132, dict(max_splits=129)),
    # The b1 h128 32K benchmark configuration: 64 splits of 128 rows.
    (cases.Case(lens=(32768,), h_q=128, page_size=64, seed=9502), 66, dict(max_splits=64)),
    # b = 3: a many-split, an empty and a few-split request; s_q = 2 causal (row = t * h + h).
    (cases.Case(lens=(70000, 0, 700), s_q=2, h_q=64, causal=True, page_size=64, seed=9503), 132,
     dict(max_splits=122, empty=True, few=True)),
    # rows = 9 (not a multiple of the 8 warps of a CTA step), several many-split requests.
    (cases.Case(lens=(5000, 0, 64, 0, 33000, 9, 0, 2000), s_q=3, h_q=3, page_size=32, seed=9504),
     132, dict(empty=True, few=True, single=True)),
]


@pytest.mark.parametrize("case,num_parts,plan", MANY_SPLIT_CASES,
                         ids=[f"{c.id}-P{n}" for c, n, _ in MANY_SPLIT_CASES])
def test_many_splits(case, num_parts, plan):
    # The split counts above are the planner's (scheduler.h): pieces for the first three cases.
    data = cases.make(case)
    splits = plan_splits(data.seq_lens, num_parts)
    assert splits.max() > _ext.limits()["MANY_SPLITS"]
    if "max_splits" in plan:
        assert splits.max() == plan["max_splits"], splits
    assert (splits == 0).any() == plan.get("empty", False)
    assert ((splits >= 2) & (splits <= _ext.limits()["MANY_SPLITS"])).any() == plan.get("few", False)
    assert (splits == 1).any() == plan.get("single", False)
    with jax.default_device(gpu()):
        sched = jax_mla.decode_schedule(jax.device_put(data.seq_lens, gpu()), num_heads=case.h_q,
                                        seq_q=case.s_q, num_parts=num_parts)
    np.testing.assert_array_equal(np.asarray(sched), _ext.testing.plan_schedule(data.seq_lens, num_parts))
    first = run_gpu(data, schedule=sched)
    check(data, *first)
    assert_rows_close(data, *first)
    assert_bit_identical(first, run_gpu(data, schedule=sched))  # fixed reduction order
    assert_bit_identical(first, run_gpu(data, schedule=sched))


PIECES_CASES = [
    cases.Case(lens=(1024,) * 16, h_q=128, page_size=64, seed=9511),  # b16/1K: auto takes pieces
    cases.Case(lens=(5000, 0, 64, 1, 700), s_q=2, h_q=64, causal=True, page_size=32, seed=9512),
    cases.Case(lens=(40000, 130, 2047), h_q=16, page_size=16, dtype="float16", seed=9513),
]


@pytest.mark.parametrize("case", PIECES_CASES, ids=lambda c: c.id)
def test_pieces_plan_matches_reference(case):
    """Pieces plans (scheduler.h: each request in equal pieces, one per part; the planner takes them
    on these cases), with the schedule inside the op and passed in: reference result per row,
    bit-identical repeats, and the device's schedule is the host's pieces plan (so the case really
    ran on pieces)."""
    data = cases.make(case)
    with jax.default_device(gpu()):
        sched = jax_mla.decode_schedule(jax.device_put(data.seq_lens, gpu()), num_heads=case.h_q,
                                        seq_q=case.s_q)
    num_parts = (np.asarray(sched).size - 2 * case.b - 3) // 8
    np.testing.assert_array_equal(np.asarray(sched), _ext.testing.plan_schedule(data.seq_lens, num_parts))
    check_pieces_plan(np.asarray(sched), data.seq_lens, num_parts)
    in_op = run_gpu(data)
    check(data, *in_op)
    assert_rows_close(data, *in_op)
    assert_bit_identical(in_op, run_gpu(data, schedule=sched))
    assert_bit_identical(in_op, run_gpu(data))


def test_in_op_schedule_many_splits_is_bit_identical():
    """The b1 h128 32K case with the schedule computed inside the op (default num_parts) equals
    the call with the same plan passed in, bit for bit, and repeats bit for bit."""
    data = cases.make(cases.Case(lens=(32768,), h_q=128, page_size=64, seed=9505))
    in_op = run_gpu(data)
    check(data, *in_op)
    with jax.default_device(gpu()):
        sched = jax_mla.decode_schedule(jax.device_put(data.seq_lens, gpu()), num_heads=128)
    assert_bit_identical(in_op, run_gpu(data, schedule=sched))
    assert_bit_identical(in_op, run_gpu(data))


@pytest.mark.parametrize("h_q,s_q", [(128, 1), (3, 2)])
@pytest.mark.parametrize("splits", [_ext.limits()["MANY_SPLITS"], _ext.limits()["MANY_SPLITS"] + 1])
def test_splits_at_the_many_split_threshold(splits, h_q, s_q):
    """A request with exactly MANY_SPLITS splits takes the one-warp-per-row path of the combine,
    one with MANY_SPLITS + 1 the CTA-per-row path; both must match the reference."""
    num_parts = _ext.limits()["MANY_SPLITS"] + 1
    seq_len = cases.len_with_splits(splits, num_parts)
    assert plan_splits([seq_len], num_parts)[0] == splits
    data = cases.make(cases.Case(lens=(seq_len,), s_q=s_q, h_q=h_q, page_size=64, causal=s_q > 1,
                                 seed=9510 + splits))
    with jax.default_device(gpu()):
        sched = jax_mla.decode_schedule(jax.device_put(data.seq_lens, gpu()), num_heads=h_q,
                                        seq_q=s_q, num_parts=num_parts)
    out, lse = run_gpu(data, schedule=sched)
    check(data, out, lse)
    assert_rows_close(data, out, lse)


EMPTY_HEAVY_CASES = [
    # Most requests empty: the combine list is long, its many items span several grid strides.
    cases.Case(lens=(0,) * 300 + (5000,) + (0,) * 40 + (70, 3, 0, 900), h_q=16, page_size=64,
               seed=9520),
    cases.Case(lens=(0,) * 1000, s_q=2, h_q=64, seed=9521),                    # all empty
    # b = 2048 (the scheduler's largest CTA shape), short and empty requests, 3 rows each.
    cases.Case(lens=tuple(int(x) for x in np.random.default_rng(9522).choice(
        [0, 0, 0, 1, 15, 16, 17, 33, 48], 2048)), s_q=1, h_q=3, page_size=16, seed=9522),
]


@pytest.mark.parametrize("case", EMPTY_HEAVY_CASES, ids=lambda c: c.id)
def test_many_empty_requests(case):
    data = cases.make(case)
    out, lse = run_gpu(data)
    check(data, out, lse)
    empty = data.seq_lens == 0
    assert (out[empty].astype(np.float32) == 0).all() and (lse[empty] == -np.inf).all()
    assert_bit_identical((out, lse), run_gpu(data))


def test_negative_length_gives_nan_for_that_request_only():
    """Under jit a negative length reaches the kernels: that request (in the combine list with no
    split) gets NaN output and LSE; the empty, few-split and many-split requests next to it are
    unaffected."""
    data = cases.make(cases.Case(lens=(0, 100, 0, 40000, 3000), h_q=16, page_size=64, seed=9530))
    q, kv, bt, sl = data.args
    bad = sl.copy()
    bad[2] = -5
    fn = jax.jit(lambda *a: jax_mla.mla_decode(*a, return_lse=True))
    out, lse = (np.asarray(x) for x in fn(*[jax.device_put(x, gpu()) for x in (q, kv, bt, bad)]))
    assert np.isnan(out[2].astype(np.float32)).all() and np.isnan(lse[2]).all()
    ok = np.array([0, 1, 3, 4])
    ref_out, ref_lse = reference_on_cpu(data)
    cases.assert_close_rel_l2(out[ok], lse[ok], np.asarray(ref_out)[ok], np.asarray(ref_lse)[ok],
                              out_tol=1e-2, lse_tol=1e-3)
    assert (out[0].astype(np.float32) == 0).all() and (lse[0] == -np.inf).all()


@pytest.mark.parametrize("h_q,b", [(64, 3), (128, 3), (64, 200)])
def test_sm90_fused_merge_ran(h_q, b):
    """On a call with split requests (one row block at h_q 64, two at 128) whose grid fits on the GPU
    at once, the SM90 decode kernel merged them itself (cuda/sm90/split_merge.cuh), also at one row
    block of more requests than parts (b = 200 against 132 parts on an H100 or H200). A launcher
    that never finds the grid fitting fails here instead of passing on the combine kernel."""
    info = jax_mla.kernel_info()
    if tuple(info.get("compute_capability") or ()) != (9, 0):
        pytest.skip("the fused merge is an SM90 kernel path")
    lens = (5000, 77, 0) if b == 3 else tuple(np.random.default_rng(32).integers(0, 3000, b))
    data = cases.make(cases.Case(lens=lens, h_q=h_q, seed=31))
    num_parts = jax_mla._api.default_num_parts(1, h_q)
    assert b <= num_parts if b == 3 else b > num_parts
    before = _ext.testing.cuda_call_stats().get("sm90_fused_merge_launches", 0)
    check(data, *run_gpu(data, kernel="sm90"))
    fused = _ext.testing.cuda_call_stats().get("sm90_fused_merge_launches", 0) - before
    assert fused == 1, (h_q, b)


def with_score_ramp(data, log2_per_tile):
    """The case's data with every request's scores rising along its keys by about log2_per_tile
    (log2 units) per 64-token tile: q's last RoPE column is set to 1 and each cached token's to a
    ramp in its position, so each row's max grows tile after tile, by more than the lazy slack
    every few tiles. Pages no request uses stay poisoned."""
    case = data.case
    q = data.q.copy()
    q[..., -1] = 1
    kv = data.kv_cache.copy()
    step = log2_per_tile / 64 / np.log2(np.e) / data.scale  # added to k[-1] per token
    page = case.page_size
    for r, n in enumerate(case.lens):
        for t in range(n):
            kv[data.block_table[r, t // page], t % page, -1] = step * t
    return cases.CaseData(case, q, kv, data.block_table, data.seq_lens, data.dense_kv)


RESCALE_CASES = [
    cases.Case(lens=(1000, 77, 0, 64), h_q=16, page_size=64, seed=41),
    cases.Case(lens=(700, 300), h_q=128, page_size=16, seed=42),
    cases.Case(lens=(513, 130), s_q=2, h_q=64, page_size=32, causal=True, seed=43),
    cases.Case(lens=(900, 5), h_q=64, page_size=128, dtype="float16", seed=44),
    # Large scores (scale 0.25: std ~6 in natural units), the reference moving on many tiles.
    cases.Case(lens=(2000, 300), h_q=128, page_size=64, softmax_scale=0.25, seed=45),
]


@pytest.mark.parametrize("ramp", [0.0, 3.0])
@pytest.mark.parametrize("case", RESCALE_CASES, ids=lambda c: c.id)
def test_lazy_rescale_matches_reference(case, ramp):
    """The SM90 kernel's lazy rescale (the softmax reference may lag the row max by 2^8) against the
    fp32 reference, on random scores and on scores ramping up along the keys (the reference then
    moves every few tiles and P reaches up to 256)."""
    info = jax_mla.kernel_info()
    if tuple(info.get("compute_capability") or ()) != (9, 0):
        pytest.skip("the lazy rescale is an SM90 kernel path")
    data = cases.make(case)
    if ramp:
        data = with_score_ramp(data, ramp)
    ref = reference_on_cpu(data)
    # One part: each request is one piece of all its tiles, so the reference lags over many tiles.
    # With the automatic schedule these small batches are cut into pieces of one or two tiles.
    with jax.default_device(gpu()):
        schedule = jax_mla.decode_schedule(jax.device_put(data.seq_lens, gpu()), num_heads=case.h_q,
                                           seq_q=case.s_q, num_parts=1)

    kw = dict(softmax_scale=case.softmax_scale, causal=case.causal, return_lse=True, kernel="sm90")
    fn = jax.jit(lambda *a: jax_mla.mla_decode(*a, schedule=schedule, **kw))
    out, lse = fn(*[jax.device_put(x, gpu()) for x in data.args])
    check(data, np.asarray(out), np.asarray(lse), ref=ref)
