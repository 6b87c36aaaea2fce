"""A CPU model of the SM90 kernel's KV ring protocol (cuda/common/kv_producer.cuh, box ring and
produce_part, and the seesaw consumers of cuda/sm90/mainloop.cuh), run under random interleavings.

The model follows consumer_main step for step: which boxes each consumer waits for, when its wgmma
reads of a box begin and end (S from issue to the owner's wait before the softmax, P V from issue to
the wgmma wait before the release), which boxes each consumer releases and when, the P-ready named
barrier between the owner and the other consumer, and the piece boundaries. The producer follows
produce_part: per piece, it clears the piece's bad-request flag slot, issues the piece's first
kPieceLookaheadTiles tiles, then waits until both consumers arrived on q_empty of the previous
piece, loads Q, then issues the other tiles; a tile's boxes load box by box, each once the tile that
last held its slot was released by both consumers (the kernel's ring holds two whole tiles, 18
slots, released per tile). A consumer waits for Q of a piece (q_full), its S wgmmas read Q until
they complete, it arrives on q_empty after the piece's last wgmma, and its epilogue (store_piece)
reads the piece's bad-request flag after that arrival.

Checked, on the kernel's ring and on every other ring size up to three tiles (the protocol does not
rely on whole tiles filling the ring), for lookaheads of 0 (the order before), 1 (the kernel's) and
2: no deadlock; no slot overwritten while a wgmma may still read it; Q not overwritten while an S
reads it, and every S reads its own piece's Q; a piece's bad-request flag slot not cleared by a later
piece before the epilogue read it (sm90/config.h kBadFlagSlots); every tile released once by each
consumer; the P-ready barrier of an owner is never arrived on again before the other consumer
passed it for the previous tile (its arrival count would complete without the other consumer).
Deliberately broken protocols must fail these checks, so the model can tell a wrong order from a
right one: a release before the P V completed, a ring of one tile, a lookahead past the ring
(deadlock), Q loaded without waiting for q_empty, two flag slots.

The FP8 cache (sm90/fp8_tiles.cuh) is modelled too: the producer lands a tile's raw bytes as a whole
once its position is free, warps 1-3 of warpgroup 0 (one actor) rewrite every tile in order in
place, and a box is full once every rewriter arrived; optionally the tile's owner rewrites a share
right before its S (an experiment, d363b13), and either release order of the other consumer's
step (S's first box before the release, as consumer_main; or after it, 2b97cfd). Checked as above,
plus: raw bytes never land in, and no rewrite writes, a slot a wgmma still reads; a rewrite reads
the raw bytes of its own tile. With gather_warps (an experiment, ebcdb2c: the sparse decode's
gathered tiles copied by all four warps of warpgroup 0), a tile's raw bytes land once the producer
(after acquiring the position and publishing the tile's slots) and warps 1-3 (after the slots are
published) both copied their shares, and warps 1-3 run, per tile t, the rewrite of t - 1 and then
their copies of t.
"""

from __future__ import annotations

import random
from collections import defaultdict

import pytest

BOXES = 9
ROPE = 8
V_BOXES = {0: range(0, 4), 1: range(4, 8)}
LOOKAHEAD = 1     # common/kv_producer.cuh kPieceLookaheadTiles
FLAG_SLOTS = 4    # sm90/config.h kBadFlagSlots


class ProtocolError(AssertionError):
    pass


def owner(g):
    return g % 2


def produce(model, slot_free):
    """The producer (produce_part + BoxRingProducer): per piece, the flag slot's clear, the first
    model.lookahead tiles, then (once both consumers left the previous piece's Q) Q, then the other
    tiles; every box in ring order, each once the box that last held its slot is free
    (slot_free(tile, box) gives the wait's predicate)."""
    g = 0
    for k, length in enumerate(model.pieces):
        model.clear_flag(k)  # on_piece
        q_before = min(length, model.lookahead)
        for j in range(length + 1):
            if j == q_before:
                if k > 0 and model.wait_q_empty:
                    yield lambda k=k: model.q_empty[k - 1] == 2
                if model.q_reads:
                    raise ProtocolError(f"Q of piece {k} loaded while S reads it: {sorted(model.q_reads)}")
                model.q_content = k
                model.q_loaded.add(k)
            if j == length:
                break
            t = g + j
            if model.fp8:  # Fp8RingProducer: acquire the position (box 0's slot), then the raw bytes
                prev = BOXES * t - model.n
                if prev >= 0:
                    yield slot_free(*divmod(prev, BOXES))
                model.slots_ready.add(t)  # gather_warps: the slots published (slots_ready)
                model.copy_share(t)
                continue
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
            raise ProtocolError(f"deadlock (producer, consumer 0, consumer 1[, rewriter] alive: {live})")
        i = rng.choice(ready)
        try:
            waits[i] = next(actors[i])
        except StopIteration:
            live[i] = False


class Model:
    def __init__(self, num_slots, pieces, release_before_pv_wait=False, lookahead=LOOKAHEAD, flag_slots=FLAG_SLOTS,
                 wait_q_empty=True, fp8=False, next_scores_first=True, owner_rewrites=False, gather_warps=False,
                 gather_lead=1):
        self.n, self.pieces = num_slots, pieces
        # The FP8 cache (sm90/fp8_tiles.cuh): a tile's raw bytes land as a whole in its position
        # (V boxes 4-7 and the RoPE box), warps 1-3 of warpgroup 0 (one actor here) rewrite it in
        # place and arrive on every box's full barrier; with owner_rewrites the tile's owner does a
        # share too, right before its S, and the barriers need its arrival as well.
        self.fp8, self.owner_rewrites = fp8, owner_rewrites
        # The other consumer's step: S of the next tile starts (its first box) before the release of
        # this one, as consumer_main does, or (False) only after the release.
        self.next_scores_first = next_scores_first
        # gather_warps: warps 1-3 copy a share of every tile too, gather_lead tiles ahead of their
        # rewrite (1: ebcdb2c's order, the rewrite of t - 1 then the copies of t).
        self.gather_warps, self.gather_lead = gather_warps, gather_lead
        self.slots_ready = set()           # gather_warps: tiles whose slots the producer published
        self.shares = defaultdict(int)     # tile -> actors that copied their share of it
        self.raw_landed = set()            # FP8: tiles whose raw bytes landed (raw_full)
        self.rewrites = defaultdict(int)   # FP8: tile -> arrivals of its rewriters (full barriers)
        self.early = release_before_pv_wait  # a broken protocol, for the model's own test
        self.wait_q_empty = wait_q_empty     # False: a broken protocol, Q loaded without waiting
        self.lookahead, self.flag_slots = lookahead, flag_slots
        self.piece_of = [k for k, length in enumerate(pieces) for _ in range(length)]  # tile -> piece
        self.q_content = None              # the piece whose Q is in shared memory
        self.q_reads = set()               # (consumer, tile) of S wgmmas in flight (they read Q)
        self.flag_owner = {}               # flag slot -> the piece that last cleared it
        self.epilogues = defaultdict(int)  # piece -> consumers whose epilogue read its flag
        self.content = [None] * num_slots  # (g, b) last loaded into each slot
        self.reads = defaultdict(set)      # slot -> active wgmma reads {(consumer, kind, g, b)}
        self.tile_releases = defaultdict(set)  # g -> consumers that released it
        self.p_ready = set()               # tiles whose owner arrived on its P-ready barrier
        self.p_passed = set()              # tiles whose P-ready barrier the other consumer passed
        self.q_empty = defaultdict(int)    # piece -> consumers done with it
        self.q_loaded = set()              # pieces whose Q the producer loaded

    def slot(self, g, b):
        return (BOXES * g + b) % self.n

    # ---- the bad-request flag slots (producer's on_piece, consumers' store_piece) ----------------
    def clear_flag(self, k):
        slot = k % self.flag_slots
        j = self.flag_owner.get(slot)
        if j is not None and self.epilogues[j] < 2:
            raise ProtocolError(f"piece {k} clears flag slot {slot} before the epilogue of piece {j} read it")
        self.flag_owner[slot] = k

    def read_flag(self, k):
        slot = k % self.flag_slots
        if self.flag_owner.get(slot) != k:
            raise ProtocolError(f"the epilogue of piece {k} reads flag slot {slot}, now piece "
                                f"{self.flag_owner.get(slot)}'s")
        self.epilogues[k] += 1

    # ---- the producer (produce_part + BoxRingProducer) -------------------------------------
    def producer(self):
        return produce(self, lambda pg, pb: lambda: len(self.tile_releases[pg]) == 2)

    # ---- a consumer (consumer_main) -----------------------------------------------------------
    def landed(self, g, b):
        if self.fp8:  # every box's full barrier completes with the last rewriter's arrival
            return self.rewrites[g] == (2 if self.owner_rewrites else 1)
        return self.content[self.slot(g, b)] == (g, b)

    # ---- FP8: the raw bytes, the rewriting warps (fp8_tiles.cuh) -------------------------------
    def load_raw(self, g):
        for b in list(range(4, 8)) + [ROPE]:  # load_fp8_tile: the pairs' bytes and the RoPE values
            s = self.slot(g, b)
            if self.reads[s]:
                raise ProtocolError(f"raw bytes of tile {g} land in slot {s} while read by {self.reads[s]}")
            self.content[s] = ("raw", g, b)
        self.raw_landed.add(g)

    def copy_share(self, g):
        """One copier's share of tile g's raw bytes (the producer's, and with gather_warps warps 1-3's):
        raw_full completes with the last share."""
        self.shares[g] += 1
        if self.shares[g] == (2 if self.gather_warps else 1):
            self.load_raw(g)

    def rewrite(self, who, g):
        """One rewriter's share of tile g (rewrite_share): wait for raw_full, convert rows in place,
        arrive on the full barriers."""
        yield lambda: g in self.raw_landed
        for b in range(BOXES):
            s = self.slot(g, b)
            if self.reads[s]:
                raise ProtocolError(f"{who} rewrites tile {g} box {b} in slot {s} while read by {self.reads[s]}")
            if b in range(4, 8) or b == ROPE:
                if self.content[s] not in (("raw", g, b), (g, b)):
                    raise ProtocolError(f"{who} rewrites tile {g} from slot {s} holding {self.content[s]}")
            self.content[s] = (g, b)
        self.rewrites[g] += 1

    def rewriter(self):
        """warps 1-3 of warpgroup 0 (dequantize_part), as one actor: every tile in order. With
        gather_warps (gather_dequantize_part): per tile t, the rewrite of t - gather_lead, then, once
        the producer published t's slots, their share of t's copies."""
        total = sum(self.pieces)
        if not self.gather_warps:
            for g in range(total):
                yield from self.rewrite("rewriter", g)
            return
        for g in range(total):
            if g >= self.gather_lead:
                yield from self.rewrite("rewriter", g - self.gather_lead)
            yield lambda g=g: g in self.slots_ready
            self.copy_share(g)
        for g in range(max(total - self.gather_lead, 0), total):
            yield from self.rewrite("rewriter", g)

    def start_read(self, c, kind, g, boxes):
        for b in boxes:
            if not self.landed(g, b):
                raise ProtocolError(f"consumer {c} {kind} reads tile {g} box {b} before it landed")
            self.reads[self.slot(g, b)].add((c, kind, g, b))

    def end_read(self, c, kind, g, boxes):
        for b in boxes:
            self.reads[self.slot(g, b)].discard((c, kind, g, b))

    def issue_s(self, c, g, boxes):
        for b in boxes:  # issue_scores: wait_box, then the box's wgmmas (which read Q and K)
            yield lambda b=b: self.landed(g, b)
            if self.q_content != self.piece_of[g]:
                raise ProtocolError(f"S of tile {g} (piece {self.piece_of[g]}) reads Q of piece {self.q_content}")
            self.q_reads.add((c, g))
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
                if self.owner_rewrites:
                    yield from self.rewrite(f"consumer {c}", g0)
                yield from self.issue_s(c, g0, range(BOXES))
            for t in range(g0, end):
                if owner(t) == c:
                    if pending is not None:
                        self.release(c, pending)
                        pending = None
                    self.end_read(c, "S", t, range(BOXES))  # wgmma_wait<0>: S done
                    self.q_reads.discard((c, t))
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
                        first = 1 if self.next_scores_first else 0
                        yield from self.issue_s(c, t + 1, range(first))  # S's first box behind the P V
                        yield lambda: True  # wgmma_wait<first>: the P V completes some time later
                        self.release(c, t, mark=not self.early)  # then the release
                        if self.owner_rewrites:
                            yield from self.rewrite(f"consumer {c}", t + 1)
                        yield from self.issue_s(c, t + 1, range(first, BOXES))
                        continue
                    pending = t
            self.release(c, pending)
            self.q_empty[k] += 1
            yield lambda: True  # the producer may run between the q_empty arrival and store_piece
            self.read_flag(k)
            g0 = end

    def run(self, seed):
        actors = [self.producer(), self.consumer(0), self.consumer(1)] + ([self.rewriter()] if self.fp8 else [])
        interleave(actors, seed)
        total = sum(self.pieces)
        assert all(len(self.tile_releases[g]) == 2 for g in range(total)), "every tile released by both consumers"


def random_pieces(rng):
    return [rng.choice([1, 1, 2, 3, 5, 8, 13]) for _ in range(rng.randint(1, 6))]


# The kernel's 18 slots (two tiles), and every other ring size up to three tiles.
RINGS = list(range(18, 28))


@pytest.mark.parametrize("lookahead", [1, 0, 2])
@pytest.mark.parametrize("num_slots", RINGS)
def test_ring_protocol_under_random_interleavings(num_slots, lookahead):
    rng = random.Random(num_slots * 2 + 1 + 1000 * lookahead)
    for trial in range(60):
        Model(num_slots, random_pieces(rng), lookahead=lookahead).run(seed=trial)


# (next_scores_first, owner_rewrites): the release first, consumer_main's order, and the owner's
# share (never with S first: test_the_model_catches_an_owner_rewrite_behind_its_own_s).
@pytest.mark.parametrize("next_scores_first,owner_rewrites", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("lookahead", [1, 0, 2])
@pytest.mark.parametrize("num_slots", [18, 27])
def test_fp8_ring_protocol_under_random_interleavings(num_slots, lookahead, next_scores_first, owner_rewrites):
    """The FP8 cache: raw bytes per whole tile, rewritten in place by warps 1-3 of warpgroup 0 (and,
    with owner_rewrites, by the tile's owner right before its S, after its release of the previous
    tile); either release order (next_scores_first True is consumer_main's). Owner rewrites
    with S issued before the release would wait on the owner's own share: the kernel never pairs them."""
    rng = random.Random(num_slots * 7 + 3 + 100 * lookahead + 10 * next_scores_first + owner_rewrites)
    for trial in range(60):
        Model(num_slots, random_pieces(rng), lookahead=lookahead, fp8=True, next_scores_first=next_scores_first,
              owner_rewrites=owner_rewrites).run(seed=trial)


@pytest.mark.parametrize("next_scores_first", [False, True])
@pytest.mark.parametrize("lookahead", [1, 0, 2])
@pytest.mark.parametrize("num_slots", [18, 27])
def test_fp8_four_gathering_warps_under_random_interleavings(num_slots, lookahead, next_scores_first):
    """ebcdb2c (an experiment): warps 1-3 copy shares of the gathered tiles, per tile the rewrite of
    the previous tile first; in either release order (False: the FP8 kernel's since 855cdff). No
    deadlock, no copy or rewrite under a read."""
    rng = random.Random(num_slots * 11 + 5 + 100 * lookahead + 7 * next_scores_first)
    for trial in range(60):
        Model(num_slots, random_pieces(rng), lookahead=lookahead, fp8=True, gather_warps=True,
              next_scores_first=next_scores_first).run(seed=trial)


def test_the_model_catches_warps_that_copy_two_tiles_ahead_of_their_rewrite():
    """With S of the next tile issued before the release (next_scores_first), copies of tile t + 1
    before the rewrite of t - 1 wait for the consumers' release of t - 2, which waits for S of t - 1,
    which needs that very rewrite: a deadlock (why gather_dequantize_part rewrites first)."""
    with pytest.raises(ProtocolError, match="deadlock"):
        for trial in range(50):
            Model(18, [8, 5], fp8=True, gather_warps=True, gather_lead=2, next_scores_first=True).run(seed=trial)


def test_the_model_catches_an_owner_rewrite_behind_its_own_s():
    """Issuing S's first box before the owner's own share of the tile is rewritten waits for an
    arrival that only comes after it: a deadlock."""
    with pytest.raises(ProtocolError, match="deadlock"):
        for trial in range(50):
            Model(18, [8, 5], fp8=True, next_scores_first=True, owner_rewrites=True).run(seed=trial)


def test_the_model_catches_fp8_raw_bytes_over_a_tile_still_read():
    """The FP8 producer waits for the tile position like the 16-bit one: releasing before the P V
    completed lets the next raw bytes land under a wgmma."""
    with pytest.raises(ProtocolError, match="while read by"):
        for trial in range(200):
            Model(18, [13, 8], release_before_pv_wait=True, fp8=True).run(seed=trial)


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


def test_the_model_catches_a_lookahead_past_the_ring():
    """Tiles issued before Q must fit in the ring: one more waits for a position that only this
    piece's own tiles (which need its Q) can free."""
    with pytest.raises(ProtocolError, match="deadlock"):
        for trial in range(50):
            Model(18, [3, 5, 4], lookahead=3).run(seed=trial)


def test_the_model_catches_q_loaded_while_read():
    with pytest.raises(ProtocolError, match="Q of piece"):
        for trial in range(100):
            Model(18, [3, 2, 4], wait_q_empty=False).run(seed=trial)


def test_the_model_catches_two_flag_slots():
    """The producer clears piece k's flag slot before the piece's first tile, when it has passed only
    q_empty of piece k - 2: the consumers may still be in the epilogue of piece k - 2 (after a
    one-tile piece k - 1), so two slots are too few; three are enough."""
    with pytest.raises(ProtocolError, match="flag slot"):
        for trial in range(300):
            Model(18, [2, 1, 1, 1, 2, 1, 1], flag_slots=2).run(seed=trial)
    for trial in range(200):
        Model(18, [2, 1, 1, 1, 2, 1, 1], flag_slots=3).run(seed=trial)
