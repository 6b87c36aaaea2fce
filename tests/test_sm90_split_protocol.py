"""A CPU model of the SM90 split parts' merge protocol (cuda/sm90/split_combine.cuh, the producer's
gate in cuda/sm90/decode_kernel.cuh), run under random interleavings.

A cluster of k CTAs walks the pieces of one split-KV part. Per piece, CTA r has a run of the piece's
KV blocks (scheduler.h split_piece; empty when the piece has fewer blocks than k). Per CTA the model
has two actors:
  - the producer: for each piece whose run is non-empty, once its consumers finished the earlier
    tiles (the ring's own empty barriers), the gate (wait until the ring is free of earlier merges),
    then the tile loads into the ring;
  - the consumers (both warpgroups as one actor: they meet at named barriers): for each piece, if
    the run is non-empty, wait for the tiles and read them; then the merge: write this CTA's O into
    its ring, arrive on split_ready of every CTA, wait on its own split_ready, read every CTA's O,
    arrive on split_done of every CTA, and (the fixed protocol) wait on its own split_done and
    advance the counter the producer's gate polls.
mbarriers are modelled with their phase-parity waits: a wait for the phase of parity P passes while
the current phase's parity differs from P, so a waiter two phases behind cannot tell.

Checked: no deadlock; nobody writes a ring (TMA or O) while a peer or its own consumers read it; each
read of an O finds the O of the piece being merged. The protocol of 7865de4 must pass for every k and
random piece layouts (empty runs included); the protocol before it (the producer waits on split_done's
parity) and one without a gate must fail, so the model can tell them apart.
"""

from __future__ import annotations

import random

import pytest

from test_sm90_ring_protocol import ProtocolError, interleave


def split_run(blocks: int, rank: int, count: int) -> int:
    """Blocks of rank's run of a piece (scheduler.h split_piece)."""
    return blocks * (rank + 1) // count - blocks * rank // count


class MBarrier:
    """An mbarrier with `expected` arrivals per phase; `phase` counts the completed phases."""

    def __init__(self, expected: int):
        self.expected = expected
        self.pending = expected
        self.phase = 0

    def arrive(self):
        self.pending -= 1
        if self.pending == 0:
            self.phase += 1
            self.pending = self.expected

    def parity_passed(self, parity: int) -> bool:
        """mbarrier.try_wait.parity: the current (incomplete) phase's parity differs from `parity`."""
        return self.phase % 2 != parity


class Cluster:
    def __init__(self, k: int, pieces: list[int], gate: str):
        self.k, self.pieces, self.gate = k, pieces, gate
        self.ready = [MBarrier(k) for _ in range(k)]
        self.done = [MBarrier(k) for _ in range(k)]
        self.merges_read = [0] * k       # the counter of the fixed protocol
        self.ring = [None] * k           # what each CTA's ring holds: ("tiles", n) or ("O", n)
        self.readers = [0] * k           # peers (and own consumers) reading each ring now
        self.loaded = [set() for _ in range(k)]  # pieces whose tiles landed, per CTA
        self.consumed = [set() for _ in range(k)]  # pieces whose tiles the consumers finished reading

    def write_ring(self, cta: int, what):
        if self.readers[cta]:
            raise ProtocolError(f"CTA {cta}'s ring overwritten with {what} while {self.readers[cta]} readers read it")
        self.ring[cta] = what

    def producer(self, cta: int):
        for n, blocks in enumerate(self.pieces):
            if split_run(blocks, cta, self.k) == 0:
                continue
            # The ring's own empty barriers: earlier tiles are loaded over only once consumed.
            earlier = [m for m in range(n) if split_run(self.pieces[m], cta, self.k)]
            yield lambda: all(m in self.consumed[cta] for m in earlier)
            if n > 0:
                if self.gate == "counter":
                    yield lambda: self.merges_read[cta] >= n
                elif self.gate == "parity":
                    yield lambda: self.done[cta].parity_passed((n - 1) % 2)
            self.write_ring(cta, ("tiles", n))
            self.loaded[cta].add(n)

    def consumers(self, cta: int):
        for n, blocks in enumerate(self.pieces):
            if split_run(blocks, cta, self.k):
                yield lambda: n in self.loaded[cta]
                if self.ring[cta] != ("tiles", n):
                    raise ProtocolError(f"CTA {cta} found {self.ring[cta]} instead of piece {n}'s tiles")
                self.readers[cta] += 1  # the tiles, read by wgmma over the piece
                yield lambda: True
                if self.ring[cta] != ("tiles", n):
                    raise ProtocolError(f"CTA {cta}'s tiles of piece {n} overwritten while read")
                self.readers[cta] -= 1
                self.consumed[cta].add(n)
            if self.gate == "parity" and n > 0:
                yield lambda: self.done[cta].parity_passed((n - 1) % 2)  # the old step 1
            self.write_ring(cta, ("O", n))
            for r in range(self.k):
                self.ready[r].arrive()
            yield lambda: self.ready[cta].parity_passed(n % 2)
            for r in range(self.k):  # read every CTA's O of piece n, interleaved with the others
                if self.ring[r] != ("O", n):
                    raise ProtocolError(f"CTA {cta} read {self.ring[r]} from CTA {r} in merge {n}")
                self.readers[r] += 1
            yield lambda: True
            for r in range(self.k):
                if self.ring[r] != ("O", n):
                    raise ProtocolError(f"CTA {r}'s O of piece {n} overwritten while CTA {cta} read it")
                self.readers[r] -= 1
            for r in range(self.k):
                self.done[r].arrive()
            if self.gate != "parity":
                yield lambda: self.done[cta].parity_passed(n % 2)
                self.merges_read[cta] = n + 1


def run(k: int, pieces: list[int], gate: str, seed: int):
    """Random interleaving of the cluster's 2k actors (producers, then consumers) until all finish."""
    cluster = Cluster(k, pieces, gate)
    interleave([cluster.producer(c) for c in range(k)] + [cluster.consumers(c) for c in range(k)], seed)


def random_pieces(rng: random.Random, k: int) -> list[int]:
    """1-5 pieces of 1 to 2k + 1 blocks: many runs empty when blocks < k."""
    return [rng.randint(1, 2 * k + 1) for _ in range(rng.randint(1, 5))]


@pytest.mark.parametrize("k", [2, 4, 8])
def test_counter_gate_is_safe(k):
    rng = random.Random(k)
    for trial in range(300):
        pieces = random_pieces(rng, k)
        run(k, pieces, "counter", seed=trial)


def test_split_runs_cover_the_piece():
    for k in (2, 4, 8):
        for blocks in range(0, 40):
            runs = [split_run(blocks, r, k) for r in range(k)]
            assert sum(runs) == blocks and max(runs) - min(runs) <= 1


@pytest.mark.parametrize("gate", ["parity", "none"])
def test_broken_gates_fail(gate):
    """The producer gate before 7865de4 (a parity wait on split_done) and no gate at all must be caught
    on some layout: e.g. a piece whose run is empty for a CTA, between two pieces where it has tiles."""
    rng = random.Random(7)
    failures = 0
    for trial in range(300):
        k = rng.choice([2, 4, 8])
        try:
            run(k, random_pieces(rng, k), gate, seed=trial)
        except ProtocolError:
            failures += 1
    assert failures > 0


def test_parity_gate_fails_on_the_known_layout():
    """k = 4, pieces of 4, 1 and 4 blocks: CTAs 0-2 have no run of the middle piece, so their
    consumers merge it without the producer, whose parity wait for merge 0 passes while merge 0 is
    still being read."""
    with pytest.raises(ProtocolError):
        for seed in range(200):
            run(4, [4, 1, 4], "parity", seed=seed)
    for seed in range(200):
        run(4, [4, 1, 4], "counter", seed=seed)
