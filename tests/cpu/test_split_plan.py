"""The scheduler's two ways of cutting a batch into parts (cuda/common/scheduler.h), the line and
pieces, and its rule for picking one. CPU only; tests/gpu/test_gpu.py checks that the device scheduler
writes the same arrays and that the GPU kernels give the reference result with pieces."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import cases
import jax_mla
from jax_mla import _ext
from test_cpu import check_against_reference, check_schedule_invariants, run_kernel

OVERHEAD = 5  # cuda/common/config.h kFixedOverheadBlocks


pytestmark = pytest.mark.usefixtures("on_cpu")  # jax's default device: the CPU (conftest.py)


def blocks(seq_lens):
    return np.array([-(-int(n) // cases.BLOCK_N) if n > 0 else 0 for n in seq_lens])


def splits_of(schedule, b, num_parts):
    s = np.asarray(schedule)
    return np.diff(s[num_parts * 8:num_parts * 8 + b + 1])


def line_plan(seq_lens, num_parts):
    """The line plan (scheduler.h), modelled independently of the planner: the whole schedule array
    it writes when it keeps the line. W = ceil(total / num_parts) units (a uniform batch's
    whole-request width when at most 1/20 wider, part_width); part p holds units [p W, p W + W)
    of the requests' cost line (blocks + OVERHEAD each, the overhead first); the combine list as
    test_cpu.check_combine_list states it."""
    b = len(seq_lens)
    nb = blocks(seq_lens)
    cost = np.where(nb > 0, nb + OVERHEAD, 0)
    C = np.concatenate([[0], np.cumsum(cost)])
    total = int(C[-1])
    w = max(1, -(-total // num_parts))
    costs = cost[cost > 0]
    if len(costs) and costs.min() == costs.max():
        c = int(costs.max())
        whole = -(-w // c) * c
        if (whole - w) * 20 <= w:
            w = whole
    splits = [0 if cost[r] == 0 else (C[r + 1] - 1) // w - (C[r] + OVERHEAD) // w + 1 for r in range(b)]
    offsets = np.concatenate([[0], np.cumsum(splits)])

    def request_of_unit(x):  # the request whose cost range holds unit x (empty ones hold none)
        return int(np.searchsorted(C[:b], x, side="right")) - 1

    def block_at(r, x):
        return int(min(max(x - C[r] - OVERHEAD, 0), nb[r]))

    parts = np.zeros((num_parts, 8), np.int64)
    for p in range(num_parts):
        x0, x1 = p * w, min(p * w + w, total)
        if x0 >= total:
            parts[p, :3] = (b, 0, b - 1)  # empty part
            continue
        r0, r1 = request_of_unit(x0), request_of_unit(x1 - 1)
        parts[p, :5] = (r0, block_at(r0, x0), r1, block_at(r1, x1), offsets[r0] + p - (C[r0] + OVERHEAD) // w)
    many = [r for r in range(b) if splits[r] > _ext.limits()["MANY_SPLITS"]]
    few = [r for r in range(b) if splits[r] != 1 and splits[r] <= _ext.limits()["MANY_SPLITS"]]
    entries = many + few + [-1] * (b - len(many) - len(few))
    return np.concatenate([parts.ravel(), offsets, [len(many) + len(few), len(many)], entries]).astype(np.int32)


def smallest_piece_blocks(nb, num_parts):
    """The pieces plan's B, by brute force: the smallest block count per piece for which every
    non-empty request's pieces fit in the parts (None when they cannot: more requests than parts)."""
    nb = nb[nb > 0]
    if len(nb) == 0 or len(nb) > num_parts:
        return None
    return next(B for B in range(1, int(nb.max()) + 1) if (-(-nb // B)).sum() <= num_parts)


def is_pieces_plan(schedule, seq_lens, num_parts):
    """Whether the schedule is the pieces plan (see pieces_plan_properties for what that means)."""
    nb = blocks(seq_lens)
    B = smallest_piece_blocks(nb, num_parts)
    return B is not None and (splits_of(schedule, len(seq_lens), num_parts) == -(-nb // B)).all()


def check_pieces_plan(schedule, seq_lens, num_parts):
    """The pieces plan: request r in ceil(nb / B) pieces (B the smallest that fits), one piece per
    part, parts in request order from part 0, slot = part, pieces of a request differing by at most
    one block; the parts after the last piece are empty."""
    s = np.asarray(schedule)
    b = len(seq_lens)
    nb = blocks(seq_lens)
    B = smallest_piece_blocks(nb, num_parts)
    assert B is not None
    splits = splits_of(s, b, num_parts)
    np.testing.assert_array_equal(splits, -(-nb // B))
    used = int(splits.sum())
    assert used <= num_parts
    info = s[:num_parts * 8].reshape(num_parts, 8)
    sizes = {}
    for p in range(num_parts):
        begin_req, begin_block, end_req, end_block, begin_slot = info[p, :5]
        if p >= used:
            assert (begin_req, end_req) == (b, b - 1), f"part {p} past the pieces is not empty"
            continue
        assert begin_req == end_req and begin_slot == p, f"part {p}: {info[p, :5]}"
        sizes.setdefault(int(begin_req), []).append(int(end_block - begin_block))
    for r, sz in sizes.items():
        assert max(sz) - min(sz) <= 1 and max(sz) <= B and min(sz) >= 1, (r, sz)


def most_expensive_part(schedule, seq_lens, num_parts):
    """The cost model's most expensive part: its blocks plus the overhead of every piece in it."""
    s = np.asarray(schedule)
    nb = blocks(seq_lens)
    worst = 0
    for p in range(num_parts):
        begin_req, begin_block, end_req, end_block = s[p * 8:p * 8 + 4]
        cost = 0
        for r in range(begin_req, end_req + 1):
            lo = begin_block if r == begin_req else 0
            hi = end_block if r == end_req else nb[r]
            if hi > lo:
                cost += hi - lo + OVERHEAD
        worst = max(worst, cost)
    return worst


def random_batches(seed, count):
    rng = np.random.default_rng(seed)
    kinds = np.array([0, 1, 63, 64, 65, 500, 1024, 4096, 30000])
    for _ in range(count):
        b = int(rng.choice([1, 2, 3, 5, 16, 33, 70]))
        lens = np.where(rng.random(b) < 0.5, rng.choice(kinds, b), rng.integers(0, 20000, b))
        yield lens.astype(np.int32)
    for b in (1, 16, 64):  # uniform, with and without empty requests
        yield np.full(b, 1024, np.int32)
        yield np.where(np.arange(b) % 5 == 2, 0, 4096).astype(np.int32)


@pytest.mark.parametrize("seed", range(4))
def test_the_plan_is_valid_and_one_of_the_two(seed):
    """Every (request, block) once, slots contiguous, combine list right; the plan is the pieces
    plan or the line; and the op's schedule (decode_schedule) is the host planner's."""
    for seq_lens in random_batches(500 + seed, 6):
        for num_parts in (1, 3, 7, 66, 132):
            sched = np.asarray(_ext.testing.plan_schedule(seq_lens, num_parts))
            check_schedule_invariants(sched, seq_lens, num_parts)
            op = jax_mla.decode_schedule(seq_lens, num_heads=64, num_parts=num_parts)
            np.testing.assert_array_equal(np.asarray(op), sched, err_msg=f"{num_parts}")
            if is_pieces_plan(sched, seq_lens, num_parts):
                check_pieces_plan(sched, seq_lens, num_parts)
            else:
                np.testing.assert_array_equal(sched, line_plan(seq_lens, num_parts))


def line_estimate(seq_lens, num_parts):
    """The line's most expensive part as auto estimates it (scheduler.h part_width and
    line_part_cost): W = ceil(total / num_parts) units, or the whole-request width of a uniform
    batch when it is at most 1/20 wider (kWholeRequestSlack); W + overhead unless the parts hold
    whole requests."""
    nb = blocks(seq_lens)
    costs = nb[nb > 0] + OVERHEAD
    w = max(1, -(-int(costs.sum()) // num_parts))
    if len(costs) and costs.min() == costs.max():
        c = int(costs.max())
        whole = -(-w // c) * c
        if (whole - w) * 20 <= w:
            return whole
    return w + OVERHEAD


@pytest.mark.parametrize("seed", range(3))
def test_auto_picks_pieces_exactly_when_not_dearer(seed):
    """The planner's rule: pieces exactly when they apply and their most expensive part, B +
    overhead, is no more than the line's estimate, else the line; and the estimate bounds the
    line's real parts."""
    for seq_lens in random_batches(600 + seed, 8):
        for num_parts in (3, 7, 66, 132):
            line = line_plan(seq_lens, num_parts)
            auto = np.asarray(_ext.testing.plan_schedule(seq_lens, num_parts))
            assert most_expensive_part(line, seq_lens, num_parts) <= line_estimate(seq_lens, num_parts)
            B = smallest_piece_blocks(blocks(seq_lens), num_parts)
            wins = B is not None and B + OVERHEAD <= line_estimate(seq_lens, num_parts)
            if wins:
                check_pieces_plan(auto, seq_lens, num_parts)
            else:
                np.testing.assert_array_equal(auto, line, err_msg=f"{seq_lens} {num_parts}")


def test_auto_plans_of_the_benchmark_configs():
    """The cost model on the benchmark's configurations (default part counts: 66 for h_q = 128,
    132 for h_q <= 64). Pieces: b16/1K (4 per request, parts of 4 + 5 units against up to 6 + 5 on
    the line), b1/32K (a tie, 8 + 5 both), b32/h64/4K (4 pieces of 16 blocks against 4 or 5 pieces
    on the line), b64/h16/8K (2 pieces of 64 against 2 or 3). b128/4K keeps the line's
    whole-request parts (more requests than parts)."""
    def plan(lens, parts):
        return np.asarray(_ext.testing.plan_schedule(np.asarray(lens, np.int32), parts))
    for lens, parts, pieces, cost, line_cost in (([1024] * 16, 66, 4, 4, 6), ([32768], 66, 64, 8, 8),
                                                 ([4096] * 32, 132, 4, 16, 17), ([8192] * 64, 132, 2, 64, 65)):
        s = plan(lens, parts)
        check_pieces_plan(s, lens, parts)
        assert (splits_of(s, len(lens), parts) == pieces).all()
        assert most_expensive_part(s, lens, parts) == cost + OVERHEAD
        assert most_expensive_part(line_plan(lens, parts), lens, parts) == line_cost + OVERHEAD
    s = plan([4096] * 128, 66)
    np.testing.assert_array_equal(s, line_plan([4096] * 128, 66))
    assert (splits_of(s, 128, 66) == 1).all()


def test_pieces_plan_check_can_fail():
    seq_lens = np.array([1000, 0, 3000, 64], np.int32)
    good = np.asarray(_ext.testing.plan_schedule(seq_lens, 20))  # the planner takes pieces here
    check_pieces_plan(good, seq_lens, 20)
    line = line_plan(seq_lens, 20)
    with pytest.raises(AssertionError):
        check_pieces_plan(line, seq_lens, 20)
    bad = good.copy()
    bad[1 * 8 + 3] -= 1  # part 1 ends a block early, part 2 does not start there
    bad[2 * 8 + 1] -= 1
    with pytest.raises(AssertionError):
        check_pieces_plan(bad, seq_lens, 20)


@pytest.mark.parametrize("case", [
    cases.Case(lens=(1024,) * 5, h_q=16, page_size=64, seed=41),
    cases.Case(lens=(3000, 0, 64, 1, 700), s_q=2, h_q=4, page_size=16, causal=True, seed=42),
    cases.Case(lens=(5000, 130), s_q=3, h_q=3, page_size=128, dtype="float16", seed=43),
], ids=lambda c: c.id)
def test_cpu_kernel_with_pieces_matches_reference(case):
    """The CPU kernel on pieces plans (the planner takes pieces on these cases, with 40 parts and
    with the op's default part count; precomputed and in-op schedule) gives the reference result."""
    data = cases.make(case)
    sched = jax_mla.decode_schedule(data.seq_lens, num_heads=case.h_q, seq_q=case.s_q, num_parts=40)
    assert is_pieces_plan(sched, data.seq_lens, 40)
    for schedule in (sched, None):
        check_against_reference(data, *run_kernel(data, schedule=schedule))


def test_cpu_rejects_a_schedule_of_the_other_plan():
    """A precomputed schedule carries its plan; the CPU handler, which checks it against its own,
    refuses a valid schedule of the other plan (here the line, where the planner takes pieces)."""
    data = cases.make(cases.Case(lens=(1024,) * 4, h_q=16, page_size=64, seed=44))
    sched = jax_mla.decode_schedule(data.seq_lens, num_heads=16, num_parts=16)
    assert is_pieces_plan(sched, data.seq_lens, 16)
    line = line_plan(data.seq_lens, 16)
    check_schedule_invariants(line, data.seq_lens, 16)
    assert not np.array_equal(np.asarray(sched), line)
    with pytest.raises(Exception, match="schedule does not match seq_lens"):
        jax.block_until_ready(run_kernel(data, schedule=line))
