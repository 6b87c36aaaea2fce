"""benchmarks/trace_chain.py: parsing of the SM90 event log and the per-transition summary."""

from __future__ import annotations

from script_loader import load_script


def _load():
    return load_script("benchmarks/trace_chain.py")


def _word(clock, event):
    return (clock << 8) | event


def test_parse_and_transitions():
    m = _load()
    ctas, roles, slots = 2, 3, 8
    words = [0] * (ctas * roles * slots)
    # CTA 1, consumer 0: S issued at 100, S done at 1300, softmax done at 2100, S issued at 2500.
    base = (1 * roles + 1) * slots
    events = [(100, 2), (1300, 3), (2100, 4), (2500, 2)]
    words[base] = len(events)
    for i, (c, e) in enumerate(events):
        words[base + 1 + i] = _word(c, e)
    # CTA 0, producer: two acquisitions.
    base = (0 * roles + 0) * slots
    words[base] = 2
    words[base + 1], words[base + 2] = _word(10, 16), _word(5010, 16)
    log = m.parse(words, ctas, roles, slots)
    assert set(log) == {(1, 1), (0, 0)}
    assert log[(1, 1)][1] == (1300, 3)
    table = m.transitions(log)
    assert table[1] == {(2, 3): [1200], (3, 4): [800], (4, 2): [400]}
    assert table[0] == {(16, 16): [5000]}
    lines = m.summary_lines(table)
    assert any("S_issued -> S_done" in line and "1200" in line for line in lines)


def test_parse_clamps_a_count_past_the_slots():
    m = _load()
    words = [0] * (1 * 3 * 4)
    words[0] = 99  # a corrupt count: only slots - 1 events exist
    words[1:4] = [_word(1, 16), _word(2, 16), _word(4, 16)]
    log = m.parse(words, 1, 3, 4)
    assert len(log[(0, 0)]) == 3


def test_load_to_use_pairs_tile_g_with_consumer_g_mod_2():
    m = _load()
    # Producer loads tiles 0, 1, 2 at 0, 100, 200; consumer 0 (tiles 0, 2) and consumer 1 (tile 1)
    # see their last boxes ready at 1000 and 2500, and 1600.
    log = {
        (0, 0): [(0, 16), (0, m.LOAD_ISSUED), (100, m.LOAD_ISSUED), (150, 16), (200, m.LOAD_ISSUED)],
        (0, 1): [(900, 9), (1000, m.LAST_BOX_READY), (2500, m.LAST_BOX_READY)],
        (0, 2): [(1600, m.LAST_BOX_READY), (1700, 2)],
    }
    assert sorted(m.load_to_use(log)) == sorted([1000 - 0, 1600 - 100, 2500 - 200])


def test_dump_cta_merges_roles_in_clock_order():
    m = _load()
    log = {(3, 0): [(10, 16), (40, m.LOAD_ISSUED)], (3, 1): [(25, 2)], (4, 1): [(0, 2)]}
    lines = m.dump_cta(log, 3)
    assert [line.split()[1:] for line in lines] == [["producer", "acquired"], ["consumer0", "S_issued"],
                                                   ["producer", "load_issued"]]
    assert lines[0].split()[0] == "0" and lines[2].split()[0] == "30"
    assert m.dump_cta(log, 9) == ["no events for CTA 9"]
