"""Where one SM90 CTA's time goes, tile by tile: reads the kernel's event log (debug builds only).

  # on the GPU machine, with a build configured with -DJAX_MLA_SM90_TRACE=ON:
  python3 benchmarks/trace_chain.py [--config b128_sq1_h128_4k]

The kernel (cuda/sm90/trace.cuh) has one elected thread per role (producer, consumer 0, consumer 1)
of every CTA log (clock64, event) at the boundaries of its work: S issued, S done, softmax done, P V
issued, P ready, P V done, stage released, last box of a tile ready, stage acquired and tile loads
issued by the producer. This runs one decode call of the config (after a warm-up call), reads the
log and prints, per role, every transition between consecutive events with its count and median
and mean duration in SM clocks, and the share of the role's time it takes; then, per tile, the
clocks from the producer's load to the consumer's wait on the tile's last box; with --cta N, that
CTA's events of all roles in clock order. A fourth role, the CTA, stamps the kernel's first
instruction and the end of the grid-dependency (PDL) wait, and every role its exit, with the global
timer as well as clock64: that gives the kernel's span across CTAs, the launch skew, the PDL wait
and the SM clock (clock64 over ns), which per-SM clocks alone cannot. Traced builds are slower (a
global store per event): compare shapes of the chain, not absolute times, with the benchmark.

Reading the marks after a named-barrier wait: P_ready is stamped when the thread reaches the
barrier, not when it opens (the --cta dump of 2026-12-03, sixth session, shows the non-owner's
P_ready before the owner's softmax_done), so P_ready -> PV_other_issued includes the wait.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

# Event ids: cuda/sm90/trace.cuh (TraceEvent).
EVENTS = {1: "piece_begin", 2: "S_issued", 3: "S_done", 4: "softmax_done", 5: "PV_own_issued", 6: "P_ready",
          7: "PV_other_issued", 8: "PV_done", 9: "released", 10: "piece_end", 11: "last_box_ready",
          16: "acquired", 17: "load_issued", 18: "cta_entry", 19: "dep_ready", 20: "exit",
          21: "producer_start", 22: "Q_slot_free", 23: "arrived", 24: "merge_wait_done", 25: "merge_done"}
LOAD_ISSUED, LAST_BOX_READY = 17, 11
CTA_ENTRY, DEP_READY, EXIT = 18, 19, 20
ARRIVED, MERGE_WAIT_DONE = 23, 24  # fused split merge (JAX_MLA_SM90_MERGE=fused), global-timer stamped
NS_FLAG = 0x80  # event ids stamped with %globaltimer (ns, 56 bits) instead of clock64
NS_WRAP = 1 << 56
ROLES = ("producer", "consumer0", "consumer1", "cta")
ROLE_CTA = 3


def parse(words, ctas: int, roles: int, slots: int):
    """{(cta, role): [(clock, event id), ...]} from the flat log (a sequence of uint64)."""
    out = {}
    for cta in range(ctas):
        for role in range(roles):
            base = (cta * roles + role) * slots
            n = int(words[base])
            if n == 0:
                continue
            n = min(n, slots - 1)
            out[(cta, role)] = [(int(w) >> 8, int(w) & 0xFF) for w in words[base + 1:base + 1 + n]]
    return out


def split_clocks(log):
    """(clock events, global-timer events) of a parsed log: the ns events (id | NS_FLAG) are
    returned apart, with the flag removed, so the clock analyses never mix the two time bases."""
    clk, ns = {}, {}
    for key, events in log.items():
        c = [(t, e) for t, e in events if not e & NS_FLAG]
        n = [(t, e & ~NS_FLAG) for t, e in events if e & NS_FLAG]
        if c:
            clk[key] = c
        if n:
            ns[key] = n
    return clk, ns


def ns_diff(a, b):
    """a - b for 56-bit global-timer stamps (wraps every ~2.3 years)."""
    return (a - b) % NS_WRAP


def earliest(stamps):
    """The earliest of global-timer stamps that lie within half the wrap of each other."""
    ref = stamps[0]
    return min(stamps, key=lambda t: (t - ref + NS_WRAP // 2) % NS_WRAP - NS_WRAP // 2)


def timeline(clk, ns):
    """Per CTA, from the global timer: entry (the kernel's first instruction), dependency ready
    (after grid_dependency_wait), last exit over its roles, all in ns relative to the first entry
    of any CTA; and the SM clock in GHz (clock64 over global-timer time from entry to last exit)."""
    entries = {}
    for (cta, role), events in ns.items():
        if role == ROLE_CTA:
            for t, e in events:
                if e == CTA_ENTRY:
                    entries[cta] = t
    if not entries:
        return []
    t0 = earliest(list(entries.values()))
    rows = []
    for cta, t_entry in sorted(entries.items()):
        dep = [t for t, e in ns.get((cta, ROLE_CTA), []) if e == DEP_READY]
        exits = [(t, role) for role in range(ROLE_CTA) for t, e in ns.get((cta, role), []) if e == EXIT]
        if not exits:
            continue
        t_exit, role_exit = max(exits, key=lambda x: ns_diff(x[0], t_entry))
        clk_entry = [t for t, e in clk.get((cta, ROLE_CTA), []) if e == CTA_ENTRY]
        clk_exit = [t for t, e in clk.get((cta, role_exit), []) if e == EXIT]
        busy_ns = ns_diff(t_exit, t_entry)
        ghz = (clk_exit[-1] - clk_entry[0]) / busy_ns if clk_entry and clk_exit and busy_ns > 0 else float("nan")
        rows.append({"cta": cta, "entry": ns_diff(t_entry, t0), "dep": ns_diff(dep[0], t0) if dep else None,
                     "exit": ns_diff(t_exit, t0), "ghz": ghz})
    return rows


def timeline_lines(rows):
    """Kernel span, launch skew, the dependency wait and the SM clock, from timeline()."""
    if not rows:
        return ["# no global-timer events (a trace build older than the CTA role?)"]
    med = lambda v: sorted(v)[len(v) // 2]
    entry = [r["entry"] for r in rows]
    exit_ = [r["exit"] for r in rows]
    dep = [r["dep"] - r["entry"] for r in rows if r["dep"] is not None]
    busy = [r["exit"] - r["entry"] for r in rows]
    ghz = [r["ghz"] for r in rows if r["ghz"] == r["ghz"]]
    lines = [f"# global timer, {len(rows)} CTAs: first entry -> last exit {max(exit_) / 1e3:.1f} us; "
             f"entries within {max(entry) / 1e3:.1f} us (median {med(entry) / 1e3:.1f}); "
             f"exits from {min(exit_) / 1e3:.1f} to {max(exit_) / 1e3:.1f} us",
             f"# per CTA: entry -> last exit median {med(busy) / 1e3:.1f} us (max {max(busy) / 1e3:.1f})"
             + (f"; entry -> dependency ready median {med(dep) / 1e3:.2f} us (max {max(dep) / 1e3:.2f})" if dep else "")]
    if ghz:
        lines.append(f"# SM clock from clock64 / global timer: median {med(ghz):.3f} GHz "
                     f"(min {min(ghz):.3f}, max {max(ghz):.3f})")
    return lines


def merge_lines(ns):
    """The fused merge's waits, from the global timer: per CTA (consumer 0), when its split pieces
    arrived and when its waits for the other pieces returned, relative to the first CTA entry. A
    wait returning long after the last arrival of every CTA would be the protocol's fault; one
    returning at the last arrival of some CTA is that CTA's lateness."""
    entries = [t for (cta, role), ev in ns.items() if role == ROLE_CTA for t, e in ev if e == CTA_ENTRY]
    if not entries:
        return []
    t0 = earliest(entries)
    arrived, waited, last_arrival = [], [], {}
    for (cta, role), ev in ns.items():
        if role != 1:
            continue
        for t, e in ev:
            if e == ARRIVED:
                arrived.append(ns_diff(t, t0))
                last_arrival[cta] = max(last_arrival.get(cta, 0), ns_diff(t, t0))
            elif e == MERGE_WAIT_DONE:
                waited.append(ns_diff(t, t0))
    if not arrived and not waited:
        return []
    q = lambda v, f: sorted(v)[min(len(v) - 1, int(f * len(v)))] / 1e3 if v else float("nan")
    late = sorted(last_arrival.items(), key=lambda kv: -kv[1])[:4]
    return [f"# fused merge: {len(arrived)} arrivals at 10/50/90/max {q(arrived, .1):.1f} / {q(arrived, .5):.1f} / "
            f"{q(arrived, .9):.1f} / {q(arrived, 1):.1f} us; {len(waited)} waits returned at "
            f"{q(waited, .1):.1f} / {q(waited, .5):.1f} / {q(waited, .9):.1f} / {q(waited, 1):.1f} us",
            "# latest last arrivals (CTA: us): " + ", ".join(f"{c}: {t / 1e3:.1f}" for c, t in late)]


def transitions(log):
    """{role: {(from event, to event): [durations in clocks]}} over consecutive events of each CTA."""
    table = {}
    for (cta, role), events in log.items():
        per = table.setdefault(role, {})
        for (t0, e0), (t1, e1) in zip(events, events[1:]):
            per.setdefault((e0, e1), []).append(t1 - t0)
    return table


def summary_lines(table):
    lines = []
    for role in sorted(table):
        per = table[role]
        total = sum(sum(v) for v in per.values()) or 1
        lines.append(f"{ROLES[role] if role < len(ROLES) else role}: {total} clocks over all CTAs")
        lines.append(f"  {'from -> to':<36} {'count':>7} {'median':>8} {'mean':>8} {'share':>6}")
        for (e0, e1), v in sorted(per.items(), key=lambda kv: -sum(kv[1])):
            v = sorted(v)
            name = f"{EVENTS.get(e0, e0)} -> {EVENTS.get(e1, e1)}"
            lines.append(f"  {name:<36} {len(v):>7} {v[len(v) // 2]:>8} {sum(v) / len(v):>8.0f} "
                         f"{100 * sum(v) / total:>5.1f}%")
    return lines


def load_to_use(log):
    """Per tile g of each CTA, the clocks from the producer's load_issued to the consumer's
    last_box_ready (the wait on the tile's last box returned). Tile g's S is issued by consumer
    g % 2 (the stage's owner), so its last_box_ready is the (g // 2)-th of that consumer's. When the
    consumer arrived before the tile landed this is the load's latency; otherwise it is the time
    the tile sat ready before its S (the lead). Returns the list over all tiles of all CTAs."""
    out = []
    ctas = {cta for cta, _ in log}
    for cta in ctas:
        loads = [t for t, e in log.get((cta, 0), []) if e == LOAD_ISSUED]
        ready = [[t for t, e in log.get((cta, 1 + c), []) if e == LAST_BOX_READY] for c in range(2)]
        for g, t_load in enumerate(loads):
            mine = ready[g % 2]
            if g // 2 < len(mine):
                out.append(mine[g // 2] - t_load)
    return out


def dump_cta(log, cta):
    """The events of one CTA, all roles merged in clock order, relative to its first event."""
    rows = [(t, role, e) for (c, role), ev in log.items() if c == cta for t, e in ev]
    if not rows:
        return [f"no events for CTA {cta}"]
    rows.sort()
    t0 = rows[0][0]
    return [f"{t - t0:>9} {ROLES[role] if role < len(ROLES) else role:<10} {EVENTS.get(e, e)}" for t, role, e in rows]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="b128_sq1_h128_4k")
    ap.add_argument("--cta", type=int, default=-1, help="also print this CTA's events in clock order")
    ap.add_argument("--cta-events", type=int, default=400, help="at most this many events of --cta")
    ap.add_argument("--calls", type=int, default=1,
                    help="decode calls back to back in one jitted step (each its own block table); the log "
                         "is the last call's, so with many calls it shows the kernel under sustained load "
                         "(the benchmark's condition: clock and power cap) rather than an isolated call")
    args = ap.parse_args()
    if args.calls < 1:
        ap.error("--calls must be >= 1")

    import jax
    import numpy as np

    import jax.numpy as jnp
    import jax_mla
    from bench_decode import build_inputs
    import configs

    cfg = configs.find(args.config)
    calls = args.calls
    # As the benchmark: consecutive calls read disjoint page sets, so none finds its KV in L2.
    kv_bytes = float(cfg.seq_lens().sum()) * 576 * 2
    num_sets = max(2, min(16, math.ceil(4 * 60 * 2**20 / kv_bytes))) if calls > 1 else 2
    q, cache, tables, seq_lens = build_inputs(cfg, np.random.default_rng(7), jnp, np, num_sets,
                                              max(2, calls))

    def step(q, c, tables, s):
        acc = jnp.zeros((), jnp.float32)
        for i in range(calls):
            out = jax_mla.mla_decode(q, c, tables[i], s, causal=cfg.causal)
            acc = acc + out[0, 0, 0, i % 512].astype(jnp.float32)
        return acc

    op = jax.jit(step)
    jax.block_until_ready(op(q, cache, tables, seq_lens))  # compile, initialise, warm up
    jax.block_until_ready(op(q, cache, tables, seq_lens))
    jax_mla._ext.sm90_trace(reset=True)
    t0 = time.perf_counter()
    jax.block_until_ready(op(q, cache, tables, seq_lens))
    step_us = (time.perf_counter() - t0) * 1e6
    print(f"# {calls} call(s) in one step: {step_us:.1f} us wall, {step_us / calls:.1f} us per call "
          f"(traced build; the log below is the last call's)")
    data, ctas, roles, slots = jax_mla._ext.sm90_trace(reset=True)
    words = np.frombuffer(data, dtype=np.uint64)
    log, ns = split_clocks(parse(words, ctas, roles, slots))
    print(f"# {cfg.name}: {len(log)} (CTA, role) logs of {ctas} CTAs x {roles} roles")
    if not log:
        print("no events: was the SM90 kernel used (kernel_info) and is this a traced build?")
        return 1
    for line in summary_lines(transitions(log)):
        print(line)
    for line in timeline_lines(timeline(log, ns)):
        print(line)
    for line in merge_lines(ns):
        print(line)
    spans = [ev[-1][0] - ev[0][0] for (cta, role), ev in log.items() if role in (1, 2) and len(ev) > 1]
    if spans:
        print(f"# consumer span per CTA: median {sorted(spans)[len(spans) // 2]} clocks "
              f"(max {max(spans)}; {math.fsum(spans) / len(spans):.0f} mean)")
    lead = sorted(load_to_use(log))
    if lead:
        q = lambda f: lead[min(len(lead) - 1, int(f * len(lead)))]
        print(f"# load_issued -> last_box_ready per tile: {len(lead)} tiles, 10/50/90% "
              f"{q(0.1)} / {q(0.5)} / {q(0.9)} clocks")
    if args.cta >= 0:
        print(f"# CTA {args.cta}, all roles, clocks from its first event:")
        for line in dump_cta(log, args.cta)[:args.cta_events]:
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
