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
