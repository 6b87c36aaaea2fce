"""What the SM90 in-kernel split merge (cuda/sm90/split_merge.cuh) assumes
of the split-KV schedule, checked on the host plan (bit-identical to the device scheduler's) for
random and adversarial batches, without a GPU:
  - only a part's first and last request can be split, so a CTA owes at most the merges of those
    two (merge_split_pieces visits exactly them);
  - the pieces of a split request are in distinct parts, their slots are first_slot .. first_slot
    + n - 1 with piece j = slot - first_slot, and every piece has at least one KV block (a piece with
    none would never arrive on the counter, and its peers would wait until the trap);
  - the row shares of the n pieces, [j R, j R + R) clipped to the row block, R = ceil(rows / n),
    cover each row block's rows exactly once."""

from __future__ import annotations

import numpy as np
import pytest

from jax_mla import _ext

PART_FIELDS = 8
BEGIN_REQ, BEGIN_BLOCK, END_REQ, END_BLOCK, BEGIN_SLOT = range(5)
BLOCK_N = 64


def num_blocks(seq_len: int) -> int:
    return 0 if seq_len <= 0 else -(-seq_len // BLOCK_N)


def pieces(seq_lens: np.ndarray, num_parts: int):
    """(part, request, begin_block, end_block, slot, num_splits) of every non-empty piece, as
    work_iterator.h's PartWork walks them."""
    b = len(seq_lens)
    sched = np.asarray(_ext.testing.plan_schedule(seq_lens, num_parts))
    split_offsets = sched[num_parts * PART_FIELDS: num_parts * PART_FIELDS + b + 1]
    out = []
    for p in range(num_parts):
        info = sched[p * PART_FIELDS:(p + 1) * PART_FIELDS]
        for r in range(info[BEGIN_REQ], info[END_REQ] + 1):
            begin = info[BEGIN_BLOCK] if r == info[BEGIN_REQ] else 0
            end = info[END_BLOCK] if r == info[END_REQ] else num_blocks(int(seq_lens[r]))
            slot = info[BEGIN_SLOT] if r == info[BEGIN_REQ] else split_offsets[r]
            if begin < end:
                out.append((p, r, begin, end, int(slot), int(split_offsets[r + 1] - split_offsets[r])))
    return out, split_offsets


def batches():
    rng = np.random.default_rng(4242)
    out = [
        np.array([1024] * 16, np.int32),          # b16/1K: 4 pieces a request
        np.array([32768], np.int32),              # b1/32K: 66 pieces
        np.array([4096] * 128, np.int32),         # whole-request parts: nothing split
        np.array([0, 1, 700, 64, 2000, 129, 3, 0], np.int32),
        np.array([0, 0, 0, 1, 15, 16, 17, 33, 48], np.int32),
        np.array([131072, 1, 1, 1], np.int32),
    ]
    for _ in range(40):
        b = int(rng.integers(1, 300))
        lens = rng.integers(0, 20000, size=b)
        lens[rng.random(b) < 0.2] = 0
        out.append(lens.astype(np.int32))
    return out


@pytest.mark.parametrize("num_parts", [1, 2, 7, 33, 66, 128, 132])
def test_split_pieces_are_a_parts_first_and_last(num_parts):
    for lens in batches():
        ps, split_offsets = pieces(lens, num_parts)
        by_part: dict[int, list] = {}
        for piece in ps:
            by_part.setdefault(piece[0], []).append(piece)
        for part, items in by_part.items():
            split = [it for it in items if it[5] > 1]
            allowed = {items[0][1], items[-1][1]}
            assert {it[1] for it in split} <= allowed, (num_parts, part, split)
        by_request: dict[int, list] = {}
        for piece in ps:
            by_request.setdefault(piece[1], []).append(piece)
        for r, items in by_request.items():
            n = items[0][5]
            assert len(items) == n, (num_parts, r, items)  # every counted piece exists and is non-empty
            if n > 1:
                assert len({it[0] for it in items}) == n  # distinct parts, hence distinct CTAs
                assert sorted(it[4] - split_offsets[r] for it in items) == list(range(n))
                assert n <= num_parts


@pytest.mark.parametrize("rows_valid", [1, 3, 16, 63, 64])
@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 9, 33, 64, 65, 66, 128])
def test_row_shares_cover_each_row_once(rows_valid, n):
    per = -(-rows_valid // n)
    covered = []
    for j in range(n):
        begin, end = min(rows_valid, j * per), min(rows_valid, j * per + per)
        covered += range(begin, end)
    assert sorted(covered) == list(range(rows_valid))
