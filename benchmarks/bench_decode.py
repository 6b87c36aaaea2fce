"""Benchmark of jax_mla.mla_decode on the configurations of configs.py; prints a table.

Method (docs/performance.md): every timed call reads a KV cache that is not L2-resident (the
cache holds several disjoint page sets and consecutive calls use different block tables, so each
call reads pages the previous one did not); calls are issued back to back, many per jitted step
(XLA cannot merge or hoist them: their block tables differ), after warm-up; the per-call time is the
median over repeats of (step time / calls per step). The split-KV schedule is planned once per step
and shared by its calls (as a model's layers share it); --schedule-per-call plans it in every call.
Unless --no-graphs, XLA command buffers are asked to capture the step into a CUDA graph:
FUSION, CUSTOM_CALL and DYNAMIC_SLICE_FUSION (each call's block table is tables[i], which XLA fuses
into the call as a dynamic-slice fusion; without that type no decode call was ever captured).
--no-graphs adds no flag, so XLA's defaults apply; with jax 0.11.2 those captured the step as well
(2026-12-03). Each row reports how many decode calls were actually traced into a graph
(_ext.testing.cuda_call_stats()): XLA runs a step's thunks one by one the first time (its warm-up),
records the graph the second time (both are time_step's untimed warm-up runs), and replays it in the
timed runs without calling the handler, so a captured row shows handler runs = 2 x calls and
traced = calls.

Usage: python benchmarks/bench_decode.py [--only NAME[,NAME...]] [--xla] [--kernel portable] [--num-parts 16,33,66]
                                        [--batch-invariant off|on|both] [--invariant-chunk TOKENS]
                                        [--cache bf16|fp8|both] [--json out.json]

--cache fp8 (or --fp8) times an FP8 cache (uint8 rows of 656 bytes, jax_mla.pack_fp8_kv of the same
random rows): rows are named jax_mla[fp8] and the copy rate is counted in FP8 bytes (656 a token), as
the FP8 issue's targets are. --cache both times the bf16 cache and the FP8 cache of the same rows in
turn in one process (A B A B ...), which is how the FP8 path is compared with the bf16 one.

--kernel times a forced CUDA kernel (mla_decode's kernel= argument: auto, sm90, sm100, portable);
the table and the JSON record it, with jax_mla.kernel_info() of the device. --num-parts times each
config once per listed split-KV part count (decode_schedule's num_parts; "0" is the default policy),
for tuning the default; rows are named jax_mla/pN. With more than one part count, the variants are
timed in turn inside one process (A B A B ...), so that the differences between processes (5-16% on
the device machine) do not enter the comparison. --batch-invariant times mla_decode(...,
batch_invariant=True) (rows tagged /bi, schedules from decode_schedule(..., batch_invariant=True));
"both" times the default and the batch-invariant calls in turn in one process, which is how the
cost of the mode is measured (--invariant-chunk: its chunk in tokens, default the API's).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from configs import CONFIGS, COPY_GBPS, EXTRA_CONFIGS, MATMUL_TFLOPS, Config  # noqa: E402

L2_BYTES = 60 * 2**20
PAGE_SIZE = 64


def _setup_xla_flags(graphs: bool) -> None:
    if graphs:
        flags = os.environ.get("XLA_FLAGS", "")
        flags += " --xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL,DYNAMIC_SLICE_FUSION --xla_gpu_graph_min_graph_size=1"
        os.environ["XLA_FLAGS"] = flags.strip()


def build_inputs(cfg: Config, rng, jnp, np, num_sets: int, calls: int, l2_resident: bool = False,
                 fp8: bool = False):
    """q, the cache with `num_sets` disjoint page sets, and one block table per call.

    Call i reads page set i % num_sets (so consecutive calls never share pages and the cache is not
    L2-resident) through its own shuffle of that set's pages: every call's operands differ, so XLA
    cannot common-subexpression-eliminate any of them.

    l2_resident (a diagnostic, --l2-resident): every request of every call reads the same few pages
    (the longest request's count, each call its own shuffle of them), so after the first tiles the
    KV comes from L2 (4.7 MB at 4K): the kernel's time without DRAM latency, which separates a
    load-bound kernel from one bound by its own chain of MMAs, softmax and synchronisation."""
    seq_lens = cfg.seq_lens()
    pages_per_req = np.maximum(1, -(-seq_lens // PAGE_SIZE))
    max_pages = int(pages_per_req.max())
    pages_per_set = int(pages_per_req.sum())
    num_pages = max_pages if l2_resident else pages_per_set * num_sets
    perm = rng.permutation(num_pages).astype(np.int32)
    tables = np.zeros((calls, cfg.batch, max_pages), np.int32)
    for i in range(calls):
        if l2_resident:
            pages = rng.permutation(perm)
            for r in range(cfg.batch):
                n = int(pages_per_req[r])
                tables[i, r, :n] = pages[:n]
            continue
        s = i % num_sets
        pages = rng.permutation(perm[s * pages_per_set:(s + 1) * pages_per_set])
        k = 0
        for r in range(cfg.batch):
            n = int(pages_per_req[r])
            tables[i, r, :n] = pages[k:k + n]
            k += n
    import jax
    key = jax.random.PRNGKey(int(rng.integers(1 << 30)))
    kq, kk = jax.random.split(key)
    q = jax.random.normal(kq, (cfg.batch, cfg.seq_q, cfg.heads, 576), jnp.float32).astype(jnp.bfloat16)
    cache = jax.random.normal(kk, (num_pages, PAGE_SIZE, 576), jnp.float32)
    if fp8:
        import jax_mla
        cache = jax.jit(jax_mla.pack_fp8_kv)(cache)  # (num_pages, PAGE_SIZE, 656) uint8
    else:
        cache = cache.astype(jnp.bfloat16)
    return q, cache, jnp.asarray(tables), jnp.asarray(seq_lens)


def time_step(fn, args, repeats: int, calls: int) -> float:
    """Median microseconds per call."""
    return time_steps_interleaved([fn], args, repeats, calls)[0]


def time_steps_interleaved(fns, args, repeats: int, calls: int) -> list[float]:
    """Median microseconds per call of each of several steps, timed in turn (A B C A B C ...) in
    one process on the same buffers, so that what differs between processes (where the buffers
    landed in memory: 5-16% on the device machine, docs/performance.md) is the same for every
    variant."""
    import jax
    for fn in fns:
        jax.block_until_ready(fn(*args))  # compile + warm-up (XLA records the CUDA graph on run 2)
        jax.block_until_ready(fn(*args))
    times = [[] for _ in fns]
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times[i].append((time.perf_counter() - t0) / calls * 1e6)
    return [sorted(t)[len(t) // 2] for t in times]


def _decode_stats(jax_mla, backend):
    """(decode handler runs, of which traced into a CUDA graph) so far in this process; None off GPU."""
    if backend != "gpu":
        return None
    st = jax_mla._ext.testing.cuda_call_stats()
    return (int(st["decode_calls"]), int(st["decode_captured"]))


def measure_ceilings():
    """Device-to-device copy bandwidth (read + write) and bf16 matmul rate on this machine."""
    import jax
    import jax.numpy as jnp
    x = jnp.ones((1 << 30,), jnp.float32)  # 4 GiB
    copy = jax.jit(lambda a: a * 1.000001)
    us = time_step(copy, (x,), 10, 1)
    copy_gbps = 2 * x.nbytes / (us * 1e-6) / 1e9
    del x
    n = 8192
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.bfloat16)
    b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.bfloat16)
    mm = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32).astype(jnp.bfloat16))
    us = time_step(mm, (a, b), 10, 1)
    return copy_gbps, 2 * n**3 / (us * 1e-6) / 1e12


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default=None,
                    help="comma-separated substrings of config names to run (a config runs if any matches); "
                         "the extra configs of configs.py (no reference time) run only when named exactly")
    ap.add_argument("--xla", action="store_true", help="also time the plain-XLA reference")
    ap.add_argument("--l2-resident", action="store_true",
                    help="diagnostic: all requests read the same pages, so the KV stays in L2 "
                         "(rows are tagged l2res; not comparable with FlashMLA's times)")
    ap.add_argument("--no-graphs", action="store_true",
                    help="add no command-buffer flags (XLA's defaults apply)")
    ap.add_argument("--schedule-per-call", action="store_true",
                    help="plan the split-KV schedule inside every call instead of once per step")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-ceilings", action="store_true")
    ap.add_argument("--kernel", default="auto", choices=["auto", "sm90", "sm100", "portable"],
                    help="CUDA kernel to time (mla_decode's kernel= argument)")
    ap.add_argument("--cache", default="bf16", choices=["bf16", "fp8", "both"],
                    help="the cache timed: bf16, FP8 (uint8 rows of 656 bytes; copy rate in FP8 bytes), or "
                         "both in turn in one process")
    ap.add_argument("--fp8", action="store_true", help="the same as --cache fp8")
    ap.add_argument("--num-parts", default="0",
                    help="comma-separated split-KV part counts to time (0 = the default policy)")
    ap.add_argument("--batch-invariant", default="off", choices=["off", "on", "both"],
                    help="time mla_decode(..., batch_invariant=True): instead of the default (on) or "
                         "interleaved with it in one process (both)")
    ap.add_argument("--invariant-chunk", type=int, default=None,
                    help="batch_invariant's chunk in tokens (default: the API's)")
    args = ap.parse_args()
    if args.fp8:
        if args.cache == "both":
            ap.error("--fp8 is --cache fp8; give one of them")
        args.cache = "fp8"
    _setup_xla_flags(not args.no_graphs)

    import jax
    import jax.numpy as jnp
    import numpy as np

    import jax_mla
    from jax_mla import reference

    backend = jax.default_backend()
    device_kind = jax.devices()[0].device_kind  # e.g. "NVIDIA H100 80GB HBM3": recorded in the JSON
    print(f"# jax {jax.__version__}, backend {backend}, device {device_kind}", flush=True)
    info = jax_mla.kernel_info()
    print(f"# kernel={args.kernel!r}; kernel_info: {info}", flush=True)
    copy_gbps, mm_tflops = COPY_GBPS, MATMUL_TFLOPS
    if backend == "gpu" and not args.no_ceilings:
        copy_gbps, mm_tflops = measure_ceilings()
        print(f"# measured ceilings: copy {copy_gbps:.0f} GB/s, bf16 matmul {mm_tflops:.0f} TFLOP/s "
              f"(facts file: {COPY_GBPS:.0f}, {MATMUL_TFLOPS:.0f})", flush=True)

    part_counts = [int(x) for x in args.num_parts.split(",")]
    if any(n < 0 for n in part_counts):
        ap.error("--num-parts takes counts >= 0 (0 = the default policy)")
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.batch_invariant]
    caches = {"bf16": [False], "fp8": [True], "both": [False, True]}[args.cache]
    # The timed variants: (num_parts, batch_invariant, fp8 cache), all in turn in one process when
    # several.
    variants = [(n, bi, fp8) for n in part_counts for bi in modes for fp8 in caches]

    rng = np.random.default_rng(1234)
    rows = []

    def dump_json(partial: bool) -> None:
        # Written after every config (partial: true), so a run cut short by a timeout keeps the rows
        # it finished; the last write (partial: false) has them all.
        if not args.json:
            return
        with open(args.json, "w") as f:
            json.dump(dict(device_kind=device_kind, jax_version=jax.__version__, argv=sys.argv[1:],
                           copy_gbps=copy_gbps, matmul_tflops=mm_tflops, kernel=args.kernel, cache=args.cache,
                           partial=partial,
                           kernel_info={k: list(v) if isinstance(v, tuple) else v for k, v in info.items()},
                           rows=rows), f, indent=1)

    def finish_row(cfg: Config, r: dict, kv_row_bytes: int) -> None:
        r["gbps"] = cfg.bytes(kv_row_bytes) / (r["us"] * 1e-6) / 1e9
        r["tflops"] = cfg.flops() / (r["us"] * 1e-6) / 1e12
        r["pct_bw"] = 100 * r["gbps"] / copy_gbps
        r["pct_mm"] = 100 * r["tflops"] / mm_tflops
        graph = (f"  handler runs {r['handler_calls']}, traced into a graph {r['traced_calls']}"
                 if "handler_calls" in r else "")
        print(f"# {r['name']:<26} {r['impl']:<18} {r['us']:9.1f} us  {r['pct_bw']:5.1f}% copy  "
              f"err {r['rel_err']:.2e}{graph}", flush=True)

    def row_bytes(fp8: bool) -> int:
        return 656 if fp8 else 2 * 576

    named = args.only.split(",") if args.only else []
    for cfg in CONFIGS + [c for c in EXTRA_CONFIGS if c.name in named]:
        if args.only and not any(o and o in cfg.name for o in named):
            continue
        kv_bytes = float(cfg.seq_lens().sum()) * row_bytes(caches[0])
        num_sets = max(2, min(16, math.ceil(4 * L2_BYTES / kv_bytes)))
        calls = max(num_sets, cfg.calls_per_step(copy_gbps, mm_tflops, hi=64))
        q, cache, tables, seq_lens = build_inputs(cfg, rng, jnp, np, num_sets, calls, args.l2_resident,
                                                  caches == [True])
        # (bf16 cache, FP8 cache): the FP8 one packs the same rows; None where not timed.
        cache_of = [cache if caches == [False] or len(caches) == 2 else None,
                    cache if caches == [True] else None]
        if len(caches) == 2:
            cache_of[1] = jax.jit(jax_mla.pack_fp8_kv)(cache.astype(jnp.float32))

        def mode_kw(bi):
            return dict(batch_invariant=True, invariant_chunk=args.invariant_chunk) if bi else {}

        def make_step(op, num_parts, bi=False, fp8=False):
            def step(q, cache_bf16, cache_fp8, tables, seq_lens):
                cache = cache_fp8 if fp8 else cache_bf16
                # One split-KV plan per step, shared by every call, as a model's layers share it
                # (and as FlashMLA's benchmark plans its metadata once): the scheduler is not timed
                # per call unless --schedule-per-call.
                def plan():
                    return jax_mla.decode_schedule(seq_lens, num_heads=cfg.heads, seq_q=cfg.seq_q,
                                                   num_parts=num_parts or None, **mode_kw(bi))
                shared = None if args.schedule_per_call else plan()
                acc = jnp.zeros((), jnp.float32)
                for i in range(calls):
                    # Per call: the op plans it itself (default policy) or from num_parts.
                    s_i = shared if not args.schedule_per_call else (plan() if num_parts else None)
                    out = op(q, cache, tables[i], seq_lens, s_i, bi)
                    acc = acc + out[0, 0, 0, i % 512].astype(jnp.float32)
                return acc
            return jax.jit(step)

        op = lambda q, c, t, s, sched=None, bi=False: jax_mla.mla_decode(  # noqa: E731
            q, c, t, s, causal=cfg.causal, schedule=sched, kernel=args.kernel, **mode_kw(bi))
        # Sanity: one call against the reference on each cache (a benchmark of a wrong kernel is
        # worthless; the FP8 one's reference reads the dequantized rows).
        err = {}
        for fp8 in caches:
            c = cache_of[fp8]
            ref, _ = reference.mla_decode_reference(q, c, tables[0], seq_lens, causal=cfg.causal,
                                                    out_dtype=jnp.float32)
            err[fp8] = 0.0
            for bi in modes:
                out = jax.jit(lambda *a, bi=bi: op(*a, None, bi))(q, c, tables[0], seq_lens)
                err[fp8] = max(err[fp8], float(jnp.linalg.norm(out.astype(jnp.float32) - ref) / jnp.linalg.norm(ref)))
            del ref
        impl = "jax_mla" if args.kernel == "auto" else f"jax_mla[{args.kernel}]"
        step_args = (q, cache_of[0], cache_of[1], tables, seq_lens)
        before = _decode_stats(jax_mla, backend)
        if len(variants) == 1:
            times = [time_step(make_step(op, *variants[0]), step_args, args.repeats, calls)]
        else:
            # One jitted step per variant (each records its own CUDA graph), timed in turn.
            steps = [make_step(op, n, bi, fp8) for n, bi, fp8 in variants]
            times = time_steps_interleaved(steps, step_args, args.repeats, calls)
        after = _decode_stats(jax_mla, backend)
        for (num_parts, bi, fp8), us in zip(variants, times):
            # Decode calls of this config that ran the handler (all variants together), and how many of
            # those were traced into a CUDA graph (replays of a recorded graph do not run the handler).
            tag = (("[fp8]" if fp8 else "") + (f"/p{num_parts}" if num_parts else "") + ("/bi" if bi else "")
                   + ("/l2res" if args.l2_resident else ""))
            row = dict(name=cfg.name, impl=impl + tag, kernel=args.kernel, num_parts=num_parts, us=us, rel_err=err[fp8],
                       fp8_cache=fp8,
                       calls=calls, sets=num_sets, l2_resident=args.l2_resident, interleaved=len(variants) > 1,
                       batch_invariant=bi, invariant_chunk=args.invariant_chunk if bi else None)
            if before is not None:
                row.update(handler_calls=after[0] - before[0], traced_calls=after[1] - before[1])
            finish_row(cfg, row, row_bytes(fp8))
            rows.append(row)
        if args.xla:
            xla_op = lambda q, c, t, s: reference.mla_decode_reference(q, c, t, s, causal=cfg.causal)[0]  # noqa
            xcalls = max(2, calls // 8)
            xcache = cache_of[caches[0]]  # the first timed cache's format
            def xstep(q, cache, tables, seq_lens, xcalls=xcalls):
                acc = jnp.zeros((), jnp.float32)
                for i in range(xcalls):
                    acc = acc + xla_op(q, cache, tables[i], seq_lens)[0, 0, 0, i].astype(jnp.float32)
                return acc
            xus = time_step(jax.jit(xstep), (q, xcache, tables, seq_lens), 3, xcalls)
            xrow = dict(name=cfg.name, impl="plain-xla" + ("[fp8]" if caches[0] else ""), us=xus,
                        rel_err=float("nan"), calls=xcalls, sets=num_sets)
            finish_row(cfg, xrow, row_bytes(caches[0]))
            rows.append(xrow)
        dump_json(partial=True)
        del q, cache, cache_of, step_args, tables, seq_lens

    print()
    print(f"{'config':<26} {'impl':<18} {'us':>8} {'GB/s':>7} {'TFLOP/s':>8} {'%copy':>6} {'%mm':>5} "
          f"{'relerr':>8}")
    for r in rows:
        print(f"{r['name']:<26} {r['impl']:<18} {r['us']:8.1f} {r['gbps']:7.0f} {r['tflops']:8.1f} "
              f"{r['pct_bw']:6.1f} {r['pct_mm']:5.1f} {r['rel_err']:8.1e}")
    print("Peers (FlashMLA, FlashAttention-3) on the same GPU: benchmarks/bench_peers.py.")
    if backend == "gpu":
        print(f"# CUDA handler: {jax_mla._ext.testing.cuda_call_stats()}")
    dump_json(partial=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
