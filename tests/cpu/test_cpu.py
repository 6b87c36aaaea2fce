"""The CPU kernel (jax_mla.mla_decode on the cpu backend) against the fp32 reference."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cases
import jax_mla
from jax_mla import _ext, _validate

CPU_PAGE_SIZES = (1, 16, 64, 128)
SWEEP = cases.random_sweep(48, master_seed=2, page_sizes=CPU_PAGE_SIZES)
CASES = cases.edge_cases(CPU_PAGE_SIZES) + SWEEP


pytestmark = pytest.mark.usefixtures("on_cpu")  # jax's default device: the CPU (conftest.py)


def run_kernel(data, **overrides):
    kw = dict(softmax_scale=data.case.softmax_scale, causal=data.case.causal, return_lse=True)
    kw.update(overrides)
    return jax_mla.mla_decode(*data.args, **kw)


def check_against_reference(data, out, lse, **ref_overrides):
    ref_out, ref_lse = cases.reference(data, **ref_overrides)
    cases.assert_close_rounding_only(out, lse, ref_out, ref_lse, data.case.dtype,
                                     cases.max_abs_score(data, ref_overrides.get("softmax_scale")))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_cpu_kernel_matches_reference(case):
    data = cases.make(case)
    out, lse = run_kernel(data)
    b, s_q, h_q = case.b, case.s_q, case.h_q
    assert out.shape == (b, s_q, h_q, 512) and out.dtype == jnp.dtype(case.dtype)
    assert lse.shape == (b, s_q, h_q) and lse.dtype == jnp.float32
    check_against_reference(data, out, lse)


def test_sweep_covers_the_brief():
    """The random sweep really contains the kinds of cases it is meant to."""
    lens = {n for c in SWEEP for n in c.lens}
    assert 0 in lens and 1 in lens and max(lens) >= 2000
    assert {c.h_q for c in SWEEP} == {1, 3, 16, 64, 128}
    assert {c.page_size for c in SWEEP} == set(CPU_PAGE_SIZES)
    assert {c.s_q for c in SWEEP} == {1, 2, 3, 4}
    assert {c.dtype for c in SWEEP} == {"bfloat16", "float16"}
    assert {c.causal for c in SWEEP} == {False, True}
    assert any(c.softmax_scale is not None for c in SWEEP)
    assert any(c.rank4_cache for c in SWEEP)
    assert max(c.b for c in SWEEP) == 8 and min(c.b for c in SWEEP) == 1
    boundary = {n % c.page_size for c in SWEEP for n in c.lens if c.page_size > 1 and n > 0}
    assert {0, 1} <= boundary


def test_return_lse_false_returns_out_only():
    data = cases.make(cases.Case(lens=(5, 70), s_q=2, h_q=3, page_size=16, seed=21))
    out_only = run_kernel(data, return_lse=False)
    out, _ = run_kernel(data)
    assert isinstance(out_only, jax.Array)
    np.testing.assert_array_equal(np.asarray(out_only), np.asarray(out))


def test_default_scale_is_576_rsqrt():
    data = cases.make(cases.Case(lens=(90,), h_q=16, seed=22))
    a = run_kernel(data)
    b = run_kernel(data, softmax_scale=576 ** -0.5)
    np.testing.assert_array_equal(np.asarray(a[0]), np.asarray(b[0]))
    check_against_reference(data, *b, softmax_scale=576 ** -0.5)


def test_jit_same_as_eager():
    data = cases.make(cases.Case(lens=(0, 130, 7), s_q=2, h_q=16, causal=True, seed=23))
    eager = run_kernel(data)
    jitted = jax.jit(lambda *a: jax_mla.mla_decode(*a, causal=True, return_lse=True))(*data.args)
    for x, y in zip(eager, jitted):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


# ----------------------------------------------------------------------------------------------
# Split-KV schedules
# ----------------------------------------------------------------------------------------------

SCHEDULE_CASE = cases.Case(lens=(0, 1, 700, 64, 2000, 129, 3, 0), s_q=2, h_q=16, page_size=16,
                           causal=True, seed=24)


def test_precomputed_schedule_gives_identical_result():
    data = cases.make(SCHEDULE_CASE)
    schedule = jax_mla.decode_schedule(data.seq_lens, num_heads=16, seq_q=2)
    with_schedule = run_kernel(data, schedule=schedule)
    in_op = run_kernel(data)
    for x, y in zip(with_schedule, in_op):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    check_against_reference(data, *with_schedule)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_num_parts_agree_to_rounding(dtype):
    data = cases.make(SCHEDULE_CASE.replace(dtype=dtype))
    results = {}
    for num_parts in (1, 7, 132):
        schedule = jax_mla.decode_schedule(data.seq_lens, num_heads=16, seq_q=2, num_parts=num_parts)
        assert schedule.shape == (num_parts * 8 + 2 * data.case.b + 3,)
        results[num_parts] = [np.asarray(x, np.float64) for x in run_kernel(data, schedule=schedule)]
        check_against_reference(data, *results[num_parts])
    u = cases.UNIT_ROUNDOFF[dtype]
    out1, lse1 = results[1]
    for num_parts in (7, 132):
        out, lse = results[num_parts]
        # Two fp32 results that agree to ~1e-6, each rounded once to the output dtype.
        assert (np.abs(out - out1) <= 2 * u * np.abs(out1) + 1e-5).all()
        finite = np.isfinite(lse1)
        np.testing.assert_array_equal(np.isfinite(lse), finite)
        np.testing.assert_allclose(lse[finite], lse1[finite], rtol=1e-5, atol=1e-5)


def test_schedule_for_other_seq_lens_is_rejected():
    data = cases.make(SCHEDULE_CASE)
    other = jax_mla.decode_schedule(data.seq_lens[::-1].copy(), num_heads=16, seq_q=2)
    with pytest.raises(Exception, match="schedule"):
        jax.block_until_ready(run_kernel(data, schedule=other))


def test_default_num_parts():
    sms = _ext.cuda_sm_count() or 132
    for s_q, h_q in [(1, 1), (1, 16), (1, 64), (1, 65), (2, 64), (4, 128), (8, 128)]:
        want = max(1, sms // math.ceil(s_q * h_q / 64))
        sched = jax_mla.decode_schedule(np.zeros(3, np.int32), num_heads=h_q, seq_q=s_q)
        assert sched.shape == (want * 8 + 2 * 3 + 3,), (s_q, h_q)


def test_schedule_size_matches_extension():
    for b, n in [(1, 1), (5, 7), (128, 132)]:
        assert _validate.schedule_size(b, n) == _ext.testing.schedule_size(b, n)


def check_schedule_invariants(schedule, seq_lens, num_parts):
    """Every (request, KV block) is covered exactly once, parts walk the requests in order, and
    each request's pieces use its slots split_offsets[r] .. split_offsets[r+1]-1 contiguously;
    the combine list names exactly the requests with a number of splits other than one."""
    b = len(seq_lens)
    schedule = np.asarray(schedule)
    assert schedule.shape == (num_parts * 8 + 2 * b + 3,) and schedule.dtype == np.int32
    offsets = schedule[num_parts * 8:num_parts * 8 + b + 1]
    nblocks = [-(-int(n) // cases.BLOCK_N) for n in seq_lens]
    assert offsets[0] == 0 and (np.diff(offsets) >= 0).all()
    covered = [[] for _ in range(b)]   # (begin, end) pieces per request, in part order
    slots = [[] for _ in range(b)]
    last = (0, 0)                      # (request, block) position reached so far
    for p in range(num_parts):
        begin_req, begin_block, end_req, end_block, begin_slot = schedule[p * 8:p * 8 + 5]
        if begin_req > end_req:        # empty part
            assert begin_req == b and end_req == b - 1
            continue
        assert 0 <= begin_req <= end_req < b
        for r in range(begin_req, end_req + 1):
            lo = begin_block if r == begin_req else 0
            hi = end_block if r == end_req else nblocks[r]
            assert 0 <= lo <= hi <= nblocks[r]
            if lo == hi:
                continue
            assert (r, lo) >= last, "parts must walk (request, block) in order"
            last = (r, hi)
            covered[r].append((lo, hi))
            slots[r].append(begin_slot if r == begin_req else offsets[r])
    for r in range(b):
        blocks = [blk for lo, hi in covered[r] for blk in range(lo, hi)]
        assert blocks == list(range(nblocks[r])), f"request {r}: blocks covered {covered[r]}"
        want_slots = list(range(offsets[r], offsets[r + 1]))
        assert slots[r] == want_slots, f"request {r}: slots {slots[r]}, want {want_slots}"
        assert (len(want_slots) == 0) == (nblocks[r] == 0)
    check_combine_list(schedule, b, num_parts)


def check_combine_list(schedule, b, num_parts):
    """The combine list (cuda/common/scheduler.h): its header counts the requests whose number of
    splits is not one and, of those, the ones with more than MANY_SPLITS; the entries list first
    the latter, then the others (0 or 2 .. MANY_SPLITS splits), each class in increasing order,
    then -1 up to b entries."""
    schedule = np.asarray(schedule)
    offsets = schedule[num_parts * 8:num_parts * 8 + b + 1]
    count, many = schedule[num_parts * 8 + b + 1:num_parts * 8 + b + 3]
    entries = schedule[num_parts * 8 + b + 3:]
    assert entries.shape == (b,)
    splits = np.diff(offsets)
    want_many = [r for r in range(b) if splits[r] > _validate.MANY_SPLITS]
    want_few = [r for r in range(b) if splits[r] != 1 and splits[r] <= _validate.MANY_SPLITS]
    assert many == len(want_many) and count == len(want_many) + len(want_few), (count, many)
    assert list(entries[:many]) == want_many
    assert list(entries[many:count]) == want_few
    assert (entries[count:] == -1).all()


@pytest.mark.parametrize("seed", range(12))
def test_schedule_invariants_and_host_planner(seed):
    rng = np.random.default_rng(100 + seed)
    b = int(rng.integers(1, 40))
    kinds = np.array([0, 1, 63, 64, 65, 500, 4096, 30000])
    seq_lens = np.where(rng.random(b) < 0.5, rng.choice(kinds, b), rng.integers(0, 9000, b))
    seq_lens = seq_lens.astype(np.int32)
    for num_parts in (1, 2, 3, 7, 64, 132, 300):
        host = _ext.testing.plan_schedule(seq_lens, num_parts)
        check_schedule_invariants(host, seq_lens, num_parts)
        op = jax_mla.decode_schedule(seq_lens, num_heads=64, num_parts=num_parts)
        np.testing.assert_array_equal(np.asarray(op), host)


def _schedule_summary(seq_lens, num_parts):
    """(non-empty parts, total workspace slots, requests in the combine list) of the host plan."""
    b = len(seq_lens)
    s = np.asarray(_ext.testing.plan_schedule(np.asarray(seq_lens, np.int32), num_parts))
    info = s[:num_parts * 8].reshape(num_parts, 8)
    used = int(sum(info[p, 0] <= info[p, 2] for p in range(num_parts)))
    return used, int(s[num_parts * 8 + b]), int(s[num_parts * 8 + b + 1])


def test_uniform_batch_gets_whole_request_parts():
    """cuda/common/scheduler.h part_width: a uniform batch whose whole-request part width is at most
    5% wider than ceil(total / num_parts) is not split at all (no partials, nothing to combine);
    otherwise, and for any non-uniform batch, the plain width applies."""
    # b128/4K, 66 parts: 128 requests of 64 + 5 units; W 134 -> 138 = 2 x 69 (+3%): 64 parts of 2.
    assert _schedule_summary([4096] * 128, 66) == (64, 128, 0)
    # The same with one request a token longer (65 blocks): not uniform, so split as before.
    used, slots, listed = _schedule_summary([4096] * 127 + [4097], 66)
    assert used == 66 and slots > 128 and listed > 0
    # Empty requests cost nothing and do not break uniformity.
    assert _schedule_summary([4096] * 64 + [0] + [4096] * 64, 66) == (64, 128, 1)
    # b16/1K: W = 6 units against requests of 21: a whole-request width would be 3.5x wider.
    used, slots, listed = _schedule_summary([1024] * 16, 66)
    assert used > 16 and listed == 16
    # The slack bound: W = 100 exactly (100 requests of 66 units over 66 parts) -> 132 = 2 x 66
    # is 32% wider: rejected; 105 parts (W = 63 -> 66, +4.8%): accepted, one request per part.
    used, slots, listed = _schedule_summary([61 * 64] * 100, 66)
    assert listed > 0
    assert _schedule_summary([61 * 64] * 100, 105) == (100, 100, 0)


def test_schedule_invariant_check_can_fail():
    seq_lens = np.array([100, 700, 5], np.int32)
    good = np.asarray(_ext.testing.plan_schedule(seq_lens, 4))
    check_schedule_invariants(good, seq_lens, 4)
    for field in (1, 3, 4):  # begin_block, end_block, begin_slot of some non-empty part
        bad = good.copy()
        p = next(p for p in range(4) if bad[p * 8] <= bad[p * 8 + 2] and bad[p * 8 + field] > 0)
        bad[p * 8 + field] -= 1
        with pytest.raises(AssertionError):
            check_schedule_invariants(bad, seq_lens, 4)


def many_and_few_lens(rng, b):
    """seq_lens mixing empty, one-block, short and very long requests, so that with 132 parts
    the plan holds requests of 0, 1, 2 .. MANY_SPLITS and more splits."""
    kinds = np.array([0, 0, 1, 64, 65, 300, 1000, 5000, 40000, 131072])
    return np.where(rng.random(b) < 0.6, rng.choice(kinds, b), rng.integers(0, 20000, b)).astype(np.int32)


@pytest.mark.parametrize("seed", range(8))
def test_combine_list_of_host_planner(seed):
    rng = np.random.default_rng(700 + seed)
    b = int(rng.choice([1, 2, 3, 17, 64, 200]))
    seq_lens = many_and_few_lens(rng, b)
    for num_parts in (1, 2, 9, 66, 132, 1000):
        host = _ext.testing.plan_schedule(seq_lens, num_parts)
        check_schedule_invariants(host, seq_lens, num_parts)
        op = jax_mla.decode_schedule(seq_lens, num_heads=16, num_parts=num_parts)
        np.testing.assert_array_equal(np.asarray(op), host)


def test_combine_list_classes_at_the_threshold():
    """Requests with exactly MANY_SPLITS and MANY_SPLITS + 1 splits fall on either side, empty
    ones are listed with the few-split class, single-split ones are not listed."""
    many = _validate.MANY_SPLITS
    num_parts = many + 1
    lens = [cases.len_with_splits(many, num_parts), cases.len_with_splits(many + 1, num_parts)]
    head = num_parts * 8 + 1 + 1  # b = 1: header after the parts and split_offsets
    for seq_len, splits, tail in [(lens[0], many, [1, 0, 0]),   # listed, few-split class
                                  (lens[1], many + 1, [1, 1, 0]),  # listed, many-split class
                                  (64, 1, [0, 0, -1])]:           # one split: not listed
        sched = np.asarray(_ext.testing.plan_schedule(np.array([seq_len], np.int32), num_parts))
        assert sched[num_parts * 8 + 1] - sched[num_parts * 8] == splits, seq_len
        assert list(sched[head:]) == tail, seq_len
    for seq_lens in ([0, lens[1], 64, 0], [lens[0], 0, lens[1]], [0, 0, 0]):
        seq_lens = np.array(seq_lens, np.int32)
        check_schedule_invariants(_ext.testing.plan_schedule(seq_lens, num_parts), seq_lens, num_parts)
    sched = np.asarray(_ext.testing.plan_schedule(np.zeros(3, np.int32), num_parts))
    assert list(sched[num_parts * 8 + 3 + 1:]) == [3, 0, 0, 1, 2]  # all empty: all listed


def test_combine_list_check_can_fail():
    seq_lens = np.array([0, 9000, 64, 700, 0], np.int32)
    num_parts = 40
    good = np.asarray(_ext.testing.plan_schedule(seq_lens, num_parts))
    check_schedule_invariants(good, seq_lens, num_parts)
    head = num_parts * 8 + len(seq_lens) + 1
    count, many = good[head:head + 2]
    assert many >= 1 and count > many + 1, (count, many)
    for pos, delta in [(head, 1), (head + 1, -1), (head + 2, 1), (head + 2 + many, 1),
                       (head + 2 + count - 1, 1)]:
        bad = good.copy()
        bad[pos] += delta
        with pytest.raises(AssertionError):
            check_combine_list(bad, len(seq_lens), num_parts)
    bad = good.copy()
    bad[head + 2 + many], bad[head + 3 + many] = bad[head + 3 + many], bad[head + 2 + many]  # order
    with pytest.raises(AssertionError):
        check_combine_list(bad, len(seq_lens), num_parts)


@pytest.mark.parametrize("num_parts", [9, 132])
def test_decode_with_many_and_few_split_requests(num_parts):
    """The CPU kernel combines the requests the list names: a plan with many-split, few-split,
    single-split and empty requests still gives the reference result."""
    case = cases.Case(lens=(0, 6000, 64, 0, 700, 3, 12000, 0), s_q=2, h_q=4, page_size=32,
                      causal=True, seed=31)
    data = cases.make(case)
    sched = np.asarray(_ext.testing.plan_schedule(data.seq_lens, num_parts))
    check_schedule_invariants(sched, data.seq_lens, num_parts)
    splits = np.diff(sched[num_parts * 8:num_parts * 8 + case.b + 1])
    assert (splits == 0).any() and (splits == 1).any() and (splits > 1).any()
    if num_parts == 132:
        assert (splits > _validate.MANY_SPLITS).any()
    out, lse = run_kernel(data, schedule=jax_mla.decode_schedule(data.seq_lens, num_heads=4, seq_q=2,
                                                                  num_parts=num_parts))
    check_against_reference(data, out, lse)
    empty = data.seq_lens == 0
    assert (np.asarray(out, np.float32)[empty] == 0).all() and (np.asarray(lse)[empty] == -np.inf).all()


# ----------------------------------------------------------------------------------------------
# Negative controls: the comparison must catch a slightly wrong kernel result
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("wrong", ["scale", "causal", "length"])
def test_comparison_catches_wrong_kernel(dtype, wrong):
    case = cases.Case(lens=(40, 300, 1000), s_q=3, h_q=16, page_size=16, causal=True, dtype=dtype,
                      seed=25)
    data = cases.make(case)
    if wrong == "scale":      # kernel run with a scale off by 1/128
        out, lse = run_kernel(data, softmax_scale=data.scale * (1 + 2 ** -7))
    elif wrong == "causal":
        out, lse = run_kernel(data, causal=False)
    else:                     # kernel that ignores the last key of every request
        out, lse = jax_mla.mla_decode(data.q, data.kv_cache, data.block_table,
                                      data.seq_lens - 1, causal=True, return_lse=True)
    with pytest.raises(AssertionError):
        check_against_reference(data, out, lse)
