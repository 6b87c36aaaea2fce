"""A CPU model of the SM90 kernel's KV ring protocol (cuda/common/kv_producer.cuh, box ring, and the
seesaw consumers of cuda/sm90/mainloop.cuh), run under random interleavings.

The model follows consumer_main step for step: which boxes each consumer waits for, when its wgmma
reads of a box begin and end (S from issue to the owner's wait before the softmax, P V from issue to
the wgmma wait before the release), which boxes each consumer releases and when, the P-ready named
barrier between the owner and the other consumer, and the piece boundaries (the producer loads the
next piece only after both consumers arrived on q_empty). The producer loads box by box, each once
the tile that last held its slot was released by both consumers (the kernel's ring holds two whole
tiles, 18 slots, released per tile).

Checked, on the kernel's ring and on every other ring size up to three tiles (the protocol does not
rely on whole tiles filling the ring): no deadlock; no slot overwritten while a wgmma may still read
it; every tile released once by each consumer; the P-ready barrier of an owner is never arrived on
again before the other consumer passed it for the previous tile (its arrival count would complete
without the other consumer). A deliberately broken protocol must fail these checks, so the model can
tell a wrong release from a right one.
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


def produce(model, slot_free):
    """The producer (produce_part + BoxRingProducer): per piece, after both consumers left the
    previous piece's Q, every box of every tile in ring order, each once the box that last held its
    slot is free (slot_free(tile, box) gives the wait's predicate)."""
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
    def __init__(self, num_slots, pieces, release_before_pv_wait=False):
        self.n, self.pieces = num_slots, pieces
        self.early = release_before_pv_wait  # a broken protocol, for the model's own test
        self.content = [None] * num_slots  # (g, b) last loaded into each slot
        self.reads = defaultdict(set)      # slot -> active wgmma reads {(consumer, kind, g, b)}
        self.tile_releases = defaultdict(set)  # g -> consumers that released it
        self.p_ready = set()               # tiles whose owner arrived on its P-ready barrier
        self.p_passed = set()              # tiles whose P-ready barrier the other consumer passed
        self.q_empty = defaultdict(int)    # piece -> consumers done with it
        self.q_loaded = set()              # pieces whose Q the producer loaded

    def slot(self, g, b):
        return (BOXES * g + b) % self.n

    # ---- the producer (produce_part + BoxRingProducer) -------------------------------------
    def producer(self):
        return produce(self, lambda pg, pb: lambda: len(self.tile_releases[pg]) == 2)

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
        if c in self.tile_releases[g]:
            raise ProtocolError(f"tile {g} released twice by consumer {c}")
        self.tile_releases[g].add(c)

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
        assert all(len(self.tile_releases[g]) == 2 for g in range(total)), "every tile released by both consumers"


def random_pieces(rng):
    return [rng.choice([1, 1, 2, 3, 5, 8, 13]) for _ in range(rng.randint(1, 6))]


# The kernel's 18 slots (two tiles), and every other ring size up to three tiles.
RINGS = list(range(18, 28))


@pytest.mark.parametrize("num_slots", RINGS)
def test_ring_protocol_under_random_interleavings(num_slots):
    rng = random.Random(num_slots * 2 + 1)
    for trial in range(60):
        Model(num_slots, random_pieces(rng)).run(seed=trial)


@pytest.mark.parametrize("num_slots", [18, 25])
def test_the_model_catches_a_release_before_the_pv_completed(num_slots):
    """Releasing a tile before waiting for one's own P V of it lets the producer overwrite a box that
    wgmma still reads: some interleaving must show it."""
    with pytest.raises(ProtocolError, match="while read by"):
        for trial in range(200):
            Model(num_slots, [13, 8], release_before_pv_wait=True).run(seed=trial)


def test_the_model_catches_a_ring_of_one_tile():
    """The seesaw has the next tile's S waiting while the current tile is still read: a ring of a
    single tile must deadlock."""
    with pytest.raises(ProtocolError, match="deadlock"):
        for trial in range(50):
            Model(9, [8]).run(seed=trial)
