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


def test_global_timer_events_are_split_from_clocks_and_give_the_timeline():
    m = _load()
    ns = lambda t, e: (t, e | m.NS_FLAG)
    # Two CTAs. CTA 0 enters at 1000 ns (clock 50), dependency ready at 3000 ns, consumer 1 exits
    # last at 101000 ns (clock 180050: 1.8 GHz over 100 us). CTA 1 enters 5000 ns later, across the
    # 56-bit wrap of the timer, and exits at 90 us after the first entry.
    wrap = m.NS_WRAP
    e0, e1 = wrap - 1000, (wrap - 1000 + 5000) % wrap
    raw = {
        (0, m.ROLE_CTA): [(50, m.CTA_ENTRY), ns(e0, m.CTA_ENTRY), (3650, m.DEP_READY),
                          ns((e0 + 2000) % wrap, m.DEP_READY)],
        (0, 0): [(100, 16), (60050, m.EXIT), ns((e0 + 60000) % wrap, m.EXIT)],
        (0, 2): [(200, 2), (180050, m.EXIT), ns((e0 + 100000) % wrap, m.EXIT)],
        (1, m.ROLE_CTA): [(0, m.CTA_ENTRY), ns(e1, m.CTA_ENTRY)],
        (1, 1): [(9, 2), (170000, m.EXIT), ns((e1 + 85000) % wrap, m.EXIT)],
    }
    clk, gt = m.split_clocks(raw)
    assert all(not e & m.NS_FLAG for events in clk.values() for _, e in events)
    assert gt[(0, 2)] == [((e0 + 100000) % wrap, m.EXIT)]
    rows = {r["cta"]: r for r in m.timeline(clk, gt)}
    assert rows[0]["entry"] == 0 and rows[0]["dep"] == 2000 and rows[0]["exit"] == 100000
    assert abs(rows[0]["ghz"] - 1.8) < 1e-9
    assert rows[1]["entry"] == 5000 and rows[1]["exit"] == 90000
    lines = m.timeline_lines(list(rows.values()))
    assert "last exit 100.0 us" in lines[0] and "entries within 5.0 us" in lines[0]
    assert "min 1.800, max 2.000" in lines[-1]  # CTA 1: 170000 clocks in 85 us
    # Logs without the CTA role (older traced builds) give no timeline, and say so.
    assert m.timeline(clk, {}) == []
    assert "no global-timer" in m.timeline_lines([])[0]
