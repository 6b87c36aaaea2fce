"""What one benchmark step of jax_mla launches and where its time goes, beside FlashMLA.

bench_peers.py times a step of `calls` back-to-back calls (one CUDA graph each side). This script
builds the same step for one config and
  - times it, interleaved with FlashMLA's graph, for a few ways of writing jax_mla's step:
      sched    the split plan passed (decode_schedule once, as bench_peers does)
      insched  the plan computed inside every call (the scheduler kernel runs per call)
      outs     as sched, but the step returns the outputs instead of a reduction of them
  - with --profile, runs one step of each variant and one FlashMLA graph inside
    cuProfilerStart/Stop, so that `ncu --profile-from-start off --metrics gpu__time_duration.sum`
    lists every kernel a step launches, with its duration (ncu serialises them: the sum is the
    step's GPU time without overlap).
  - with --timeline, records one step of each variant and one FlashMLA graph with torch.profiler
    (CUPTI activity records, which also see the kernels of XLA's graphs in this process; Nsight
    Systems is not on the device machine) and prints, per side, every kernel's start, duration and
    the gap before it, then the step's span, busy time and gaps: how consecutive calls overlap.
  - with --sustain S, runs each variant's step back to back for S seconds while nvidia-smi samples
    the SM clock and the power every 50 ms, and prints their medians per variant (a kernel whose
    sustained clock drops under power limits is slower back to back than in one isolated call).

Usage: python benchmarks/step_anatomy.py --only b128_sq1_h128_4k [--calls 16] [--profile]
"""

from __future__ import annotations

import argparse
import ctypes
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

from bench_decode import L2_BYTES, _setup_xla_flags, build_inputs  # noqa: E402
from bench_peers import PAGE_SIZE, load_peers  # noqa: E402
from configs import CONFIGS  # noqa: E402


def timeline(run, names, calls) -> None:
    """One step of each of `names` under torch.profiler: the CUDA kernels of each, in start order
    (from the chrome trace's "kernel" events: ts and dur in us)."""
    import json
    import tempfile

    import torch
    from torch.profiler import ProfilerActivity, profile

    for n in names:
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            run(n)
            torch.cuda.synchronize()
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            prof.export_chrome_trace(f.name)
            events = json.load(open(f.name)).get("traceEvents", [])
        kernels = sorted(((float(e["ts"]), float(e["dur"]), e.get("name", "?")) for e in events
                          if e.get("cat") == "kernel" and "dur" in e), key=lambda k: k[0])
        if not kernels:
            print(f"timeline {n}: no kernel recorded", flush=True)
            continue
        t0 = kernels[0][0]
        prev_end, busy, gaps, overlap = t0, 0.0, 0.0, 0.0
        print(f"timeline {n}: {len(kernels)} kernels in one step of {calls} calls (us: start, duration, "
              f"gap before)", flush=True)
        for i, (start, dur, name) in enumerate(kernels):
            gap = start - prev_end
            gaps += max(gap, 0.0)
            overlap += max(-gap, 0.0)
            busy += dur
            if i < 12 or i >= len(kernels) - 4:
                print(f"  {start - t0:9.1f} {dur:8.1f} {gap:7.1f}  {name[:90]}", flush=True)
            elif i == 12:
                print("  ...", flush=True)
            prev_end = max(prev_end, start + dur)
        span = prev_end - t0
        print(f"timeline {n}: span {span:.1f} us ({span / calls:.1f} per call), kernels {busy:.1f}, "
              f"gaps {gaps:.1f}, overlap {overlap:.1f}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--peers", default=os.path.join(HERE, "..", ".peers", "lib"))
    ap.add_argument("--only", required=True, help="one config name (benchmarks/configs.py)")
    ap.add_argument("--calls", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--timeline", action="store_true", help="kernel start / duration / gap of one step each")
    ap.add_argument("--sustain", type=float, default=0.0, help="seconds of back-to-back steps per variant")
    args = ap.parse_args()
    _setup_xla_flags(True)

    import numpy as np
    import torch
    import jax
    import jax.numpy as jnp

    import jax_mla

    flashmla, _, _ = load_peers(args.peers)
    cfg = next(c for c in CONFIGS if c.name == args.only)
    calls = args.calls
    kv_bytes = float(cfg.seq_lens().sum()) * 576 * 2
    num_sets = max(2, min(16, math.ceil(4 * L2_BYTES / kv_bytes)))
    q, cache, tables, seq_lens = build_inputs(cfg, np.random.default_rng(7), jnp, np, num_sets, calls)
    q_t, cache_t, tables_t, lens_t = (torch.from_dlpack(x) for x in (q, cache, tables, seq_lens))
    kcache4 = cache_t.view(cache_t.shape[0], PAGE_SIZE, 1, 576)
    scale = 576 ** -0.5
    _, _, fm_meta, fm_splits = flashmla.dense_decode_fwd(q_t, kcache4, 512, lens_t, tables_t[0], scale,
                                                          cfg.causal, None, None)
    sched = jax_mla.decode_schedule(seq_lens, num_heads=cfg.heads, seq_q=cfg.seq_q)

    def step(mode):
        def fn(q, cache, tables, seq_lens, sch):
            outs, acc = [], jnp.zeros((), jnp.float32)
            for i in range(calls):
                out = jax_mla.mla_decode(q, cache, tables[i], seq_lens, causal=cfg.causal,
                                         schedule=None if mode == "insched" else sch)
                outs.append(out)
                acc = acc + out[0, 0, 0, i % 512].astype(jnp.float32)
            return tuple(outs) if mode == "outs" else acc
        return jax.jit(fn)

    steps = {m: step(m) for m in ("sched", "insched", "outs")}
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        flashmla.dense_decode_fwd(q_t, kcache4, 512, lens_t, tables_t[0], scale, cfg.causal, fm_meta, fm_splits)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        for i in range(calls):
            flashmla.dense_decode_fwd(q_t, kcache4, 512, lens_t, tables_t[i], scale, cfg.causal, fm_meta, fm_splits)

    def run(name):
        t0 = time.perf_counter()
        if name == "flashmla":
            graph.replay()
            torch.cuda.synchronize()
        else:
            jax.block_until_ready(steps[name](q, cache, tables, seq_lens, sched))
        return (time.perf_counter() - t0) / calls * 1e6

    names = ["flashmla"] + list(steps)
    for n in names:
        run(n), run(n)
    if args.profile:
        cuda = ctypes.CDLL("libcuda.so.1")
        torch.cuda.synchronize()
        cuda.cuProfilerStart()
        for n in names:
            run(n)
        cuda.cuProfilerStop()
        print(f"# profiled one step of each of {names} ({calls} calls)", flush=True)
        return 0
    if args.timeline:
        timeline(run, names, calls)
        return 0
    if args.sustain > 0:
        import subprocess
        for n in names:
            smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                                    "-lms", "50"], stdout=subprocess.PIPE, text=True)
            t_end, per_call = time.perf_counter() + args.sustain, []
            while time.perf_counter() < t_end:
                per_call.append(run(n))
            smi.terminate()
            samples = []
            for line in smi.communicate()[0].splitlines():
                try:
                    clk, pw = (float(x) for x in line.split(","))
                    samples.append((clk, pw))
                except ValueError:
                    pass
            clk = sorted(c for c, _ in samples) or [float("nan")]
            pw = sorted(p for _, p in samples) or [float("nan")]
            per_call.sort()
            print(f"sustain {n:<10} {per_call[len(per_call) // 2]:8.1f} us/call  SM clock median {clk[len(clk) // 2]:.0f} "
                  f"MHz (min {clk[0]:.0f})  power median {pw[len(pw) // 2]:.0f} W (max {pw[-1]:.0f})  "
                  f"{len(samples)} samples", flush=True)
        return 0
    times = {n: [] for n in names}
    for _ in range(args.repeats):
        for n in names:
            times[n].append(run(n))
    print(f"# {torch.cuda.get_device_name()} {cfg.name}: us per call, median of {args.repeats} "
          f"interleaved rounds, {calls} calls per step")
    for n in names:
        t = sorted(times[n])
        print(f"{n:<10} {t[len(t) // 2]:8.1f}  (min {t[0]:.1f}, max {t[-1]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
