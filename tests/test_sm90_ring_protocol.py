"""A CPU model of the SM90 kernel's KV ring protocol (cuda/common/kv_producer.cuh, box ring, and the
seesaw consumers of cuda/sm90/decode_kernel.cuh), run under random interleavings.

The model follows consumer_main step for step: which boxes each consumer waits for, when its wgmma
reads of a box begin and end (S from issue to the owner's wait before the softmax, P V from issue to
the wgmma wait before the release), which boxes each consumer releases and when, the P-ready named
barrier between the owner and the other consumer, and the piece boundaries (the producer loads the
next piece only after both consumers arrived on q_empty). The producer loads box by box, each once
the box that last held its slot was released: per tile (both consumers done with that tile: the
wide shape's ring, and the tile-done barriers of docs/experiments/2026-12-05-sm90-box-ring-tile-done.patch
for any ring size) or box by box (by that box's last reader alone: the narrow shape).

Checked, for every ring size a kernel could use: no deadlock; no slot overwritten while a wgmma may
still read it; no box released twice or by the wrong consumer; the P-ready barrier of an owner is
never arrived on again before the other consumer passed it for the previous tile (its arrival count
would complete without the other consumer). A deliberately broken protocol must fail these checks,
so the model can tell a wrong release from a right one.
"""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

BOXES = 9
ROPE = 8
V_BOXES = {0: range(0, 4), 1: range(4, 8)}


class ProtocolError(AssertionError):
    pass


def owner(g):
    return g % 2


def releases(c, g):
    """Boxes of tile g that consumer c releases in a box-by-box ring (decode_kernel.cuh release_tile)."""
    return list(V_BOXES[c]) + ([ROPE] if owner(g) != c else [])


def produce(model, slot_free):
    """The producer (produce_part + BoxRingProducer) of either model: per piece, after both consumers
    left the previous piece's Q, every box of every tile in ring order, each once the box that last
    held its slot is free (slot_free(tile, box) gives the wait's predicate)."""
    g = 0
    for k, length in enumerate(model.pieces):
        if k > 0:
            yield lambda k=k: model.q_empty[k - 1] == 2
        model.q_loaded.add(k)
        for t in range(g, g + length):
            for b in range(BOXES):
                prev = BOXES * t + b - model.n  # the box that last held this slot
                if prev >= 0:
                    yield slot_free(*divmod(prev, BOXES))
                s = model.slot(t, b)
                if model.reads[s]:
                    raise ProtocolError(f"tile {t} box {b} loaded into slot {s} while read by {model.reads[s]}")
                model.content[s] = (t, b)
        g += length


def interleave(actors, seed):
    """Runs the actors (generators yielding wait predicates: producer, consumer 0, consumer 1) in a
    random order of the ready ones until all finish; none ready while some live is a deadlock."""
    rng = random.Random(seed)
    waits = [next(a, None) for a in actors]
    live = [w is not None for w in waits]
    while any(live):
        ready = [i for i, w in enumerate(waits) if live[i] and w()]
        if not ready:
            raise ProtocolError(f"deadlock (producer, consumer 0, consumer 1 alive: {live})")
        i = rng.choice(ready)
        try:
            waits[i] = next(actors[i])
        except StopIteration:
            live[i] = False


class Model:
    def __init__(self, num_slots, per_tile, pieces, releaser=releases, release_before_pv_wait=False):
        self.n, self.whole, self.pieces, self.releaser = num_slots, per_tile, pieces, releaser
        self.early = release_before_pv_wait  # a broken protocol, for the model's own test
        self.content = [None] * num_slots  # (g, b) last loaded into each slot
        self.reads = defaultdict(set)      # slot -> active wgmma reads {(consumer, kind, g, b)}
        self.released = {}                 # (g, b) -> releasing consumer (box mode)
        self.tile_releases = defaultdict(int)  # g -> consumers that released it (per-tile mode)
        self.p_ready = set()               # tiles whose owner arrived on its P-ready barrier
        self.p_passed = set()              # tiles whose P-ready barrier the other consumer passed
        self.q_empty = defaultdict(int)    # piece -> consumers done with it
        self.q_loaded = set()              # pieces whose Q the producer loaded

    def slot(self, g, b):
        return (BOXES * g + b) % self.n

    # ---- the producer (produce_part + BoxRingProducer) -------------------------------------
    def producer(self):
        if self.whole:
            return produce(self, lambda pg, pb: lambda: self.tile_releases[pg] == 2)
        return produce(self, lambda pg, pb: lambda: (pg, pb) in self.released)

    # ---- a consumer (consumer_main) -----------------------------------------------------------
    def landed(self, g, b):
        return self.content[self.slot(g, b)] == (g, b)

    def start_read(self, c, kind, g, boxes):
        for b in boxes:
            if not self.landed(g, b):
                raise ProtocolError(f"consumer {c} {kind} reads tile {g} box {b} before it landed")
            self.reads[self.slot(g, b)].add((c, kind, g, b))

    def end_read(self, c, kind, g, boxes):
        for b in boxes:
            self.reads[self.slot(g, b)].discard((c, kind, g, b))

    def issue_s(self, c, g, boxes):
        for b in boxes:  # issue_scores: wait_box, then the box's wgmmas
            yield lambda b=b: self.landed(g, b)
            self.start_read(c, "S", g, [b])

    def pv_boxes(self, c, g):
        return list(V_BOXES[c]) + ([] if owner(g) == c else [ROPE])  # the other's P V reads P in the RoPE box

    def release(self, c, g, mark=True):
        self.end_read(c, "PV", g, self.pv_boxes(c, g))  # wgmma_wait before the release
        if mark:
            self.mark_released(c, g)

    def mark_released(self, c, g):
        if self.whole:
            self.tile_releases[g] += 1
            return
        for b in self.releaser(c, g):
            if (g, b) in self.released:
                raise ProtocolError(f"tile {g} box {b} released twice")
            if c != (b // 4 if b < ROPE else 1 - owner(g)):
                raise ProtocolError(f"tile {g} box {b} released by consumer {c}, not by its last reader")
            self.released[(g, b)] = c

    def consumer(self, c):
        g0 = 0
        for k, length in enumerate(self.pieces):
            end = g0 + length
            yield lambda k=k: k in self.q_loaded  # q_full
            pending = None
            if owner(g0) == c:
                yield from self.issue_s(c, g0, range(BOXES))
            for t in range(g0, end):
                if owner(t) == c:
                    if pending is not None:
                        self.release(c, pending)
                        pending = None
                    self.end_read(c, "S", t, range(BOXES))  # wgmma_wait<0>: S done
                    if t - 2 >= g0 and (t - 2) not in self.p_passed:
                        raise ProtocolError(f"owner {c} arrives on P-ready for tile {t} before tile {t - 2}'s was passed")
                    self.p_ready.add(t)  # softmax, P into the RoPE box, bar.arrive
                    self.start_read(c, "PV", t, self.pv_boxes(c, t))
                    pending = t
                else:
                    if pending is not None:  # our own P V of the previous tile done
                        self.release(c, pending)
                        pending = None
                    yield lambda t=t: t in self.p_ready  # bar.sync on the owner's P-ready
                    self.p_passed.add(t)
                    self.start_read(c, "PV", t, self.pv_boxes(c, t))
                    if t + 1 < end:
                        if self.early:
                            self.mark_released(c, t)
                        yield from self.issue_s(c, t + 1, [0])  # S's first box behind the P V
                        self.release(c, t, mark=not self.early)  # wgmma_wait<1>, release
                        yield from self.issue_s(c, t + 1, range(1, BOXES))
                        continue
                    pending = t
            self.release(c, pending)
            self.q_empty[k] += 1
            g0 = end

    def run(self, seed):
        interleave([self.producer(), self.consumer(0), self.consumer(1)], seed)
        total = sum(self.pieces)
        if self.whole:
            assert all(self.tile_releases[g] == 2 for g in range(total))
        else:
            assert len(self.released) == total * BOXES, "every box of every tile released once"


def random_pieces(rng):
    return [rng.choice([1, 1, 2, 3, 5, 8, 13]) for _ in range(rng.randint(1, 6))]


# (slots, release per tile): every ring size from the wide shape's 18 to 27, released per tile (the
# wide shape at 18; the tile-done patch at any size) and box by box (the narrow shape at 25).
RINGS = [(n, per_tile) for n in range(18, 28) for per_tile in (True, False)]


@pytest.mark.parametrize("num_slots,per_tile", RINGS, ids=[f"{n}-{'tile' if t else 'box'}" for n, t in RINGS])
def test_ring_protocol_under_random_interleavings(num_slots, per_tile):
    rng = random.Random(num_slots * 2 + per_tile)
    for trial in range(60):
        Model(num_slots, per_tile, random_pieces(rng)).run(seed=trial)


@pytest.mark.parametrize("num_slots,per_tile", [(18, True), (25, True), (18, False), (25, False)])
def test_the_model_catches_a_release_before_the_pv_completed(num_slots, per_tile):
    """Releasing a tile before waiting for one's own P V of it lets the producer overwrite a box that
    wgmma still reads: some interleaving must show it."""
    with pytest.raises(ProtocolError, match="while read by"):
        for trial in range(200):
            Model(num_slots, per_tile, [13, 8], release_before_pv_wait=True).run(seed=trial)


def test_the_model_catches_a_wrong_releaser():
    """The owner releasing the RoPE box, whose last reader is the other consumer's P V."""

    def owner_releases_rope(c, g):
        return list(V_BOXES[c]) + ([ROPE] if owner(g) == c else [])

    with pytest.raises(ProtocolError, match="not by its last reader"):
        Model(25, False, [5], releaser=owner_releases_rope).run(seed=0)


def test_the_model_catches_a_ring_of_one_tile():
    """The seesaw has the next tile's S waiting while the current tile is still read: a ring of a
    single tile must deadlock."""
    for per_tile in (True, False):
        with pytest.raises(ProtocolError, match="deadlock"):
            for trial in range(50):
                Model(9, per_tile, [8]).run(seed=trial)


# ---- the transposed shape (cuda/sm90/transposed_kernel.cuh) ------------------------------------


class TransposedModel:
    """consumer_t_main: both consumers read every tile. Per tile and consumer c: S^T over all nine
    boxes (wait_box each, reads until the wgmma wait); then c releases the RoPE box and the other
    consumer's V boxes; on a request's last tile both meet at kBarTScores and c zeroes dead rows of
    its own V boxes (a generic-proxy write); P V reads its own V boxes until the wgmma wait, then c
    releases them. Every box needs both consumers' releases (BoxRingBarriers box_releases = 2)."""

    def __init__(self, num_slots, pieces, pipelined=False, split_k=False, zero_without_barrier=False,
                 release_own_after_s=False):
        self.n, self.pieces, self.pipelined, self.split_k = num_slots, pieces, pipelined, split_k
        self.no_barrier, self.own_early = zero_without_barrier, release_own_after_s  # broken protocols
        self.content = [None] * num_slots
        self.reads = defaultdict(set)
        self.releases = defaultdict(set)  # (g, b) -> consumers that released it
        self.s_done = defaultdict(set)    # g -> consumers whose S^T of g completed
        self.q_empty = defaultdict(int)
        self.q_loaded = set()

    def slot(self, g, b):
        return (BOXES * g + b) % self.n

    def producer(self):
        return produce(self, lambda pg, pb: lambda: len(self.releases[(pg, pb)]) == 2)

    def release(self, c, g, boxes):
        for b in boxes:
            if c in self.releases[(g, b)]:
                raise ProtocolError(f"tile {g} box {b} released twice by consumer {c}")
            self.releases[(g, b)].add(c)

    def s_boxes(self, c):
        # kSplitK: k-steps 0-17 (boxes 0-3 and half of 4) and 18-35 (the other half of 4, 5-8).
        if not self.split_k:
            return range(BOXES)
        return range(0, 5) if c == 0 else range(4, BOXES)

    def issue_s(self, c, t):
        for b in self.s_boxes(c):  # issue_scores_t: wait_box, then the box's wgmmas
            yield lambda t=t, b=b: self.content[self.slot(t, b)] == (t, b)
            self.reads[self.slot(t, b)].add((c, "S", t, b))

    def s_complete(self, c, t):
        for b in self.s_boxes(c):  # wgmma_wait: S^T done
            self.reads[self.slot(t, b)].discard((c, "S", t, b))
        self.s_done[t].add(c)

    def consumer(self, c):
        own, other = list(V_BOXES[c]), list(V_BOXES[1 - c])
        g0 = 0
        for k, length in enumerate(self.pieces):
            yield lambda k=k: k in self.q_loaded
            end = g0 + length
            if self.pipelined:
                yield from self.issue_s(c, g0)
            for t in range(g0, end):
                if not self.pipelined:
                    yield from self.issue_s(c, t)
                self.s_complete(c, t)
                if self.split_k:  # the partial-S^T exchange: kBarTScores on every tile
                    yield lambda t=t: len(self.s_done[t]) == 2
                self.release(c, t, other + [ROPE] + (own if self.own_early else []))
                if t == end - 1:  # the request's last tile (the model's pieces end on one)
                    if not self.no_barrier and not self.split_k:
                        yield lambda t=t: len(self.s_done[t]) == 2  # kBarTScores
                    for b in own:  # zero_dead_v_rows: nobody may be reading the box
                        readers = {r for r in self.reads[self.slot(t, b)] if r[0] != c}
                        if self.content[self.slot(t, b)] != (t, b) or readers:
                            raise ProtocolError(f"consumer {c} zeroes tile {t} box {b} while read by {readers}")
                for b in own:
                    if self.content[self.slot(t, b)] != (t, b):
                        raise ProtocolError(f"consumer {c} P V reads tile {t} box {b} after it was reloaded")
                    self.reads[self.slot(t, b)].add((c, "PV", t, b))
                if self.pipelined and t + 1 < end:
                    yield from self.issue_s(c, t + 1)  # S^T of the next tile behind the P V
                yield lambda: True  # P V in flight (wgmma_wait<1> / <0>)
                for b in own:
                    self.reads[self.slot(t, b)].discard((c, "PV", t, b))
                if not self.own_early:
                    self.release(c, t, own)
            self.q_empty[k] += 1
            g0 = end

    def run(self, seed):
        interleave([self.producer(), self.consumer(0), self.consumer(1)], seed)
        total = sum(self.pieces)
        assert all(len(self.releases[(g, b)]) == 2 for g in range(total) for b in range(BOXES))


@pytest.mark.parametrize("num_slots", [9, 18, 25, 27])
def test_transposed_ring_protocol_under_random_interleavings(num_slots):
    """The kernel uses 25 slots; with both consumers on the same tile even a one-tile ring works."""
    rng = random.Random(num_slots)
    for trial in range(60):
        TransposedModel(num_slots, random_pieces(rng)).run(seed=trial)


@pytest.mark.parametrize("num_slots", [18, 25, 27])
def test_pipelined_transposed_ring_protocol_under_random_interleavings(num_slots):
    """kPipelined reads the next tile's boxes (S^T) before releasing the current tile's V boxes: the
    ring must hold two tiles (the kernel's 25 slots do)."""
    rng = random.Random(100 + num_slots)
    for trial in range(60):
        TransposedModel(num_slots, random_pieces(rng), pipelined=True).run(seed=trial)


@pytest.mark.parametrize("num_slots", [18, 23, 25])
def test_split_k_transposed_ring_protocol_under_random_interleavings(num_slots):
    """kSplitK (always pipelined; the kernel uses 23 slots): each consumer reads half of the boxes in
    S^T, and the two meet on every tile to add their partial scores."""
    rng = random.Random(200 + num_slots)
    for trial in range(60):
        TransposedModel(num_slots, random_pieces(rng), pipelined=True, split_k=True).run(seed=trial)


def test_the_pipelined_transposed_model_deadlocks_on_a_one_tile_ring():
    with pytest.raises(ProtocolError, match="deadlock"):
        for trial in range(50):
            TransposedModel(9, [8], pipelined=True).run(seed=trial)


def test_the_transposed_model_catches_zeroing_without_the_barrier():
    with pytest.raises(ProtocolError, match="zeroes"):
        for trial in range(200):
            TransposedModel(25, [3, 1, 2], zero_without_barrier=True).run(seed=trial)


def test_the_transposed_model_catches_releasing_own_boxes_before_pv():
    with pytest.raises(ProtocolError, match="while read by|after it was reloaded"):
        for trial in range(200):
            TransposedModel(9, [8, 5], release_own_after_s=True).run(seed=trial)
