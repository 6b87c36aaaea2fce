"""Batches for the batch-invariance tests (mla_decode(..., batch_invariant=True)), CPU and GPU.

A few "target" requests with fixed data are decoded alone, then inside batches of random others
(fresh data every batch: other lengths, other contents, other page ids, NaN in every page slot no
request owns), each target first, last or somewhere in the middle. With batch_invariant=True a
target's out and lse must be bitwise the same in every batch; the default plans give no such
promise, and sensitivity() finds a batch where they do differ, which is what shows that the
comparison can fail.
"""

from __future__ import annotations

import dataclasses

import numpy as np

import cases

HEAD_DIM_QK = cases.HEAD_DIM_QK


@dataclasses.dataclass(frozen=True)
class Config:
    """The static side of one invariance test: every batch shares it."""
    target_lens: tuple[int, ...]  # one target request per length
    s_q: int = 1
    h_q: int = 16
    page_size: int = 64
    dtype: str = "bfloat16"
    causal: bool = False
    other_long: int = 6000        # others' lengths reach up to this
    seed: int = 0


@dataclasses.dataclass
class Target:
    data: cases.CaseData  # the request alone, as a one-request case (its dense keys included)

    @property
    def q(self) -> np.ndarray:      # (s_q, h_q, 576)
        return self.data.q[0]

    @property
    def keys(self) -> np.ndarray:   # (seq_len, 576)
        return self.data.dense_kv[0]


def targets(cfg: Config) -> list[Target]:
    out = []
    for i, n in enumerate(cfg.target_lens):
        case = cases.Case(lens=(n,), s_q=cfg.s_q, h_q=cfg.h_q, page_size=cfg.page_size, dtype=cfg.dtype,
                          causal=cfg.causal, seed=cfg.seed * 1000 + i)
        out.append(Target(cases.make(case)))
    return out


def other_lengths(rng, n: int, cfg: Config) -> list[int]:
    """Lengths of the random others: 0, 1, page and block boundaries, odd, long."""
    page = cfg.page_size
    kinds = np.array([0, 1, 2, 63, 64, 65, page - 1, page + 1, 127, 1023, 1024, 1025])
    lens = []
    for _ in range(n):
        u = rng.random()
        if u < 0.45:
            lens.append(int(rng.choice(kinds)))
        elif u < 0.9:
            lens.append(int(rng.integers(0, 1500)))
        else:
            lens.append(int(rng.integers(1500, cfg.other_long + 1)))
    return [max(x, 0) for x in lens]


@dataclasses.dataclass
class Batch:
    args: tuple            # q, kv_cache, block_table, seq_lens
    positions: list[int]   # where each target sits


def key_pool(rng, cfg: Config, rows: int = 1 << 16) -> np.ndarray:
    """Random cache rows to draw the others' keys from (drawing every batch's keys afresh costs
    seconds at b = 256 with long requests; a fresh draw of rows from the pool does not)."""
    return rng.standard_normal((rows, HEAD_DIM_QK), np.float32).astype(cases.DTYPES[cfg.dtype])


def batch(rng, cfg: Config, tgts: list[Target], num_others: int, focus: int, where: str,
          pool: np.ndarray | None = None, bucket: bool = False) -> Batch:
    """The targets among num_others random requests: target `focus` first, last or in the middle
    (where), the other targets at random places. Every page id is shuffled, and the cache holds
    NaN wherever no request's token lives. pool: draw the others' keys from these rows (else
    afresh); bucket: round the cache's page count and the table's width up to powers of two, so
    that batches of one size share a compiled call."""
    dt = cases.DTYPES[cfg.dtype]
    b = num_others + len(tgts)
    lens = other_lengths(rng, num_others, cfg)
    # Positions: the focus target first / last / middle, the rest at random free places.
    slots = list(range(b))
    fixed = {"first": 0, "last": b - 1, "middle": b // 2}[where]
    slots.remove(fixed)
    rng.shuffle(slots)
    positions = [0] * len(tgts)
    positions[focus] = fixed
    rest = iter(slots)
    for t in range(len(tgts)):
        if t != focus:
            positions[t] = next(rest)
    q = rng.standard_normal((b, cfg.s_q, cfg.h_q, HEAD_DIM_QK)).astype(dt)
    seq_lens = np.zeros(b, np.int32)
    keys = [None] * b
    others = iter(lens)
    for r in range(b):
        if r in positions:
            t = tgts[positions.index(r)]
            q[r] = t.q
            keys[r] = t.keys
        else:
            n = next(others)
            keys[r] = (rng.standard_normal((n, HEAD_DIM_QK)).astype(dt) if pool is None
                       else pool[rng.integers(0, pool.shape[0], n)])
        seq_lens[r] = keys[r].shape[0]
    page = cfg.page_size
    pages_of = [-(-int(n) // page) for n in seq_lens]
    num_pages = sum(pages_of) + int(rng.integers(1, 4))
    max_pages = max(max(pages_of), 1) + int(rng.integers(0, 3))
    if bucket:
        num_pages, max_pages = 1 << (num_pages - 1).bit_length(), 1 << (max_pages - 1).bit_length()
    ids = rng.permutation(num_pages).astype(np.int32)
    kv = np.full((num_pages, page, HEAD_DIM_QK), np.nan, dtype=dt)
    table = rng.choice(np.array([-1, num_pages, 2**31 - 1], np.int64), size=(b, max_pages)).astype(np.int32)
    nxt = 0
    for r in range(b):
        for i in range(pages_of[r]):
            pid = ids[nxt]
            nxt += 1
            table[r, i] = pid
            rows = keys[r][i * page:(i + 1) * page]
            kv[pid, :rows.shape[0]] = rows
    return Batch((q, kv, table, seq_lens), positions)


def batch_sizes() -> tuple[int, ...]:
    """Others per batch: 0 (the targets alone together) and 1 .. 256."""
    return (0, 1, 2, 5, 17, 63, 128, 256)


def batches(cfg: Config, tgts: list[Target], sizes=None, seed=0, pool=False, bucket=False):
    """(batch, description) for every size, with each placement (first, last, middle) in turn
    given to one of the targets; fresh others every batch."""
    rng = np.random.default_rng(seed)
    rows = key_pool(rng, cfg) if pool else None
    k = 0
    for n in batch_sizes() if sizes is None else sizes:
        for where in ("first", "last", "middle"):
            focus = k % len(tgts)
            k += 1
            yield batch(rng, cfg, tgts, n, focus, where, pool=rows, bucket=bucket), f"{where} for target {focus}"


def alone(run, tgts: list[Target]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each target's (out, lse) run on its own, without the batch axis."""
    return [tuple(np.asarray(x)[0] for x in run(*t.data.args)) for t in tgts]


def check_invariant(run, cfg: Config, *, sizes=None, seed=0, pool=False, bucket=False) -> int:
    """run(q, kv_cache, block_table, seq_lens) -> (out, lse) with batch_invariant=True, or a list of
    such runs used in turn from batch to batch (e.g. with and without a passed schedule). Asserts
    that every target's out and lse are bitwise those of the target run alone, in every batch.
    Returns the number of (target, batch) comparisons made."""
    runs = list(run) if isinstance(run, (list, tuple)) else [run]
    tgts = targets(cfg)
    want = alone(runs[0], tgts)
    compared = 0
    for i, (bt, how) in enumerate(batches(cfg, tgts, sizes, seed, pool, bucket)):
        out, lse = (np.asarray(x) for x in runs[i % len(runs)](*bt.args))
        for t, pos in enumerate(bt.positions):
            label = (f"target {t} (seq_len {cfg.target_lens[t]}) at {pos} of a batch of "
                     f"{len(bt.args[3])} ({how}, run {i % len(runs)})")
            assert np.array_equal(out[pos], want[t][0], equal_nan=True), f"out of {label}"
            assert np.array_equal(lse[pos], want[t][1], equal_nan=True), f"lse of {label}"
            compared += 1
    return compared


def find_difference(run, cfg: Config, *, sizes=None, seed=0, pool=False, bucket=False) -> str | None:
    """The same batches as check_invariant, run by `run` (the default plans); the first target
    whose bits differ from its run alone, described, or None when every one matched."""
    tgts = targets(cfg)
    want = alone(run, tgts)
    for bt, how in batches(cfg, tgts, sizes, seed, pool, bucket):
        out, lse = (np.asarray(x) for x in run(*bt.args))
        for t, pos in enumerate(bt.positions):
            if not (np.array_equal(out[pos], want[t][0], equal_nan=True)
                    and np.array_equal(lse[pos], want[t][1], equal_nan=True)):
                diff = np.abs(np.asarray(out[pos], np.float64) - np.asarray(want[t][0], np.float64))
                return (f"target {t} (seq_len {cfg.target_lens[t]}) at {pos} of a batch of "
                        f"{len(bt.args[3])}: max |out - alone| = {np.nanmax(diff):.3g}")
    return None
