"""jax_mla against FlashMLA and FlashAttention-3, timed in one process on the same buffers.

The peers are built from their own sources by benchmarks/peers/ (README there): FlashMLA's SM90
dense decode (deepseek-ai/FlashMLA) and FlashAttention-3's MLA path (Dao-AILab/flash-attention
hopper/, hdim 64 / hdim_v 512: q = the 64 RoPE columns, qv = the 512 latent columns, k_cache /
v_cache = column views of the same 576-wide cache). All three read the same q, cache, block tables
and lengths: jax_mla's arrays, handed to torch by DLPack without a copy.

Method (docs/performance.md):
- Each config's cache holds several disjoint page sets; call i reads set i % sets through its own
  shuffled block table, so consecutive calls never share pages and the KV is not L2-resident.
- Each kernel's split plan is computed once per step, outside the timed region, as a model's layers
  share it: jax_mla.decode_schedule, FlashMLA's scheduler metadata, FA3's get_scheduler_metadata.
- A step is `calls` back-to-back calls in one CUDA graph (jax_mla: a jitted step that XLA captures
  as a command buffer; the peers: torch.cuda.CUDAGraph). calls is chosen so that a step lasts
  several milliseconds (16..128 calls): the one launch and synchronisation per step then add ~1%.
- Every step is timed on the host clock from launch to synchronisation, the same way for all three;
  the three run in interleaved rounds (A B C A B C ...), and the time per call is the median over
  rounds of step time / calls.
- Before timing, one call of each is checked: the three outputs and LSEs against each other, and
  against a float64 reference for the first and last request.
- --fp8 adds a fourth column, jax_mla[fp8]: jax_mla over jax_mla.pack_fp8_kv of the same cache
  (issue #36; the peers have no dense FP8 decode), in the same interleaved rounds, checked against
  the float64 reference on the dequantized rows (unpack_fp8_kv). Its GB/s count FP8 bytes (656 a
  token); its ratio is to the best bf16 peer.

Usage: python benchmarks/bench_peers.py [--peers .peers/lib] [--only NAME[,NAME...]] [--repeats 15]
                                        [--json out.json] [--label TEXT] [--profile] [--fp8]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# torch and jax share the GPU: jax must not take 75% of its memory up front.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

from bench_decode import L2_BYTES, _setup_xla_flags, build_inputs, measure_ceilings  # noqa: E402
from configs import CONFIGS, COPY_GBPS, MATMUL_TFLOPS  # noqa: E402

PAGE_SIZE = 64          # FlashMLA's dense decode takes page size 64 only
IMPLS = ("flashmla", "fa3", "jax_mla")
# A kernel whose output is off by more than bf16 rounding is not timed as a peer: outputs of
# bf16 inputs agree with a float64 reference to ~3e-3; NaN fails.
MAX_OUT_REL_ERR = 2e-2
MAX_LSE_ABS_ERR = 1e-3


def load_peers(lib_dir: str):
    """FlashMLA's module and FA3's torch operators from benchmarks/peers/build.sh's output."""
    import torch
    spec = importlib.util.spec_from_file_location("flashmla_dense", os.path.join(lib_dir, "flashmla_dense.so"))
    flashmla = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(flashmla)
    torch.ops.load_library(os.path.join(lib_dir, "fa3_mla.so"))
    pins = open(os.path.join(lib_dir, "PINS")).read().split("\n")
    return flashmla, torch.ops.flash_attn_3, [p for p in pins if p]


def capture_graph(fn, calls: int):
    """A torch CUDA graph of fn(0) .. fn(calls - 1), after two warm-up calls on a side stream (the
    capture must not record first-call allocations or module loads)."""
    import torch
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(2):
            fn(i)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i)
    return graph


def time_interleaved(run, names, repeats: int) -> dict:
    """{name: [us per call of each round]}: run(name) twice each to warm up (compiles; XLA records
    its command buffer on the second run), then `repeats` rounds in which every name runs once."""
    for name in names:
        run(name), run(name)
    times = {name: [] for name in names}
    for _ in range(repeats):
        for name in names:
            times[name].append(run(name))
    return times


def reference_request(q, cache, table, seq_len: int, causal: bool, scale: float):
    """float64 output (s_q, h, 512) and LSE (s_q, h) of one request, from its gathered rows."""
    import numpy as np
    s_q = q.shape[0]
    pages = table[: -(-seq_len // PAGE_SIZE)]
    kv = cache[pages].reshape(-1, 576)[:seq_len].astype(np.float64)
    s = np.einsum("thd,nd->thn", q.astype(np.float64), kv) * scale
    if causal:
        t = np.arange(s_q)[:, None, None]
        n = np.arange(seq_len)[None, None, :]
        s = np.where(n > seq_len - s_q + t, -np.inf, s)
    m = s.max(-1, keepdims=True)
    lse = m[..., 0] + np.log(np.exp(s - m).sum(-1))
    p = np.exp(s - lse[..., None])
    return np.einsum("thn,nd->thd", p, kv[:, :512]), lse


def profile_once(cfg, call_flashmla, call_fa3, decode, jax_args) -> None:
    """One call of each kernel inside cudaProfilerStart/Stop (for ncu --profile-from-start off),
    after two untimed calls of each."""
    import jax
    import torch
    one = jax.jit(decode)
    runs = {"flashmla": lambda: call_flashmla(1), "fa3": lambda: call_fa3(1),
            "jax_mla": lambda: jax.block_until_ready(one(*jax_args))}
    for fn in runs.values():
        fn(), fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for fn in runs.values():
        fn()
        torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(f"# {cfg.name}: profiled one call of each of {list(runs)}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--peers", default=os.path.join(HERE, "..", ".peers", "lib"),
                    help="folder with flashmla_dense.so, fa3_mla.so and PINS (benchmarks/peers/build.sh)")
    ap.add_argument("--only", default=None, help="comma-separated substrings of config names")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--json", default=None)
    ap.add_argument("--label", default="", help="recorded in the JSON (e.g. the jax_mla commit)")
    ap.add_argument("--fp8", action="store_true",
                    help="also time jax_mla over the FP8 cache of the same rows (column jax_mla[fp8])")
    ap.add_argument("--profile", action="store_true",
                    help="no timing: after the checks, one call of each inside cudaProfilerStart/Stop "
                         "(ncu --profile-from-start off); use with --only")
    args = ap.parse_args()
    _setup_xla_flags(True)

    import numpy as np
    import torch
    import jax
    import jax.numpy as jnp

    import jax_mla

    flashmla, fa3, pins = load_peers(args.peers)
    impls = IMPLS + (("jax_mla[fp8]",) if args.fp8 else ())
    device = torch.cuda.get_device_name()
    print(f"# {device}; torch {torch.__version__}, jax {jax.__version__}, jax_mla {jax_mla.__version__} "
          f"{args.label}", flush=True)
    for p in pins:
        print(f"# peer {p}", flush=True)
    copy_gbps, mm_tflops = (COPY_GBPS, MATMUL_TFLOPS) if args.profile else measure_ceilings()
    print(f"# measured ceilings: copy {copy_gbps:.0f} GB/s (read + write), bf16 matmul {mm_tflops:.0f} TFLOP/s",
          flush=True)

    scale = 576 ** -0.5
    rng = np.random.default_rng(1234)
    rows = []
    failed = []

    def dump_json(partial: bool) -> None:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(device_kind=device, torch_version=torch.__version__, jax_version=jax.__version__,
                               jax_mla_version=jax_mla.__version__, label=args.label, peers=pins,
                               copy_gbps=copy_gbps, matmul_tflops=mm_tflops, partial=partial, argv=sys.argv[1:],
                               rows=rows), f, indent=1)

    named = args.only.split(",") if args.only else []
    for cfg in CONFIGS:
        if named and not any(o and o in cfg.name for o in named):
            continue
        t_cfg = time.perf_counter()
        kv_bytes = float(cfg.seq_lens().sum()) * 576 * 2
        num_sets = max(2, min(16, math.ceil(4 * L2_BYTES / kv_bytes)))
        calls = cfg.calls_per_step(copy_gbps, mm_tflops)
        q, cache, tables, seq_lens = build_inputs(cfg, rng, jnp, np, num_sets, calls)
        # The same buffers, seen by torch (read only).
        q_t, cache_t, tables_t, lens_t = (torch.from_dlpack(x) for x in (q, cache, tables, seq_lens))
        kcache4 = cache_t.view(cache_t.shape[0], PAGE_SIZE, 1, 576)  # FlashMLA / FA3: (pages, page, h_k, d)
        q_nope, q_rope = q_t[..., :512], q_t[..., 512:]
        v_cache, k_cache = kcache4[..., :512], kcache4[..., 512:]

        # --- split plans, once per step ---
        sched = jax_mla.decode_schedule(seq_lens, num_heads=cfg.heads, seq_q=cfg.seq_q)
        _, _, fm_meta, fm_splits = flashmla.dense_decode_fwd(q_t, kcache4, 512, lens_t, tables_t[0], scale,
                                                              cfg.causal, None, None)
        fa_meta = fa3.get_scheduler_metadata(cfg.batch, cfg.seq_q, int(cfg.seq_lens().max()), cfg.heads, 1, 64, 512,
                                             torch.bfloat16, lens_t, page_size=PAGE_SIZE, is_causal=cfg.causal)

        def call_flashmla(i):
            return flashmla.dense_decode_fwd(q_t, kcache4, 512, lens_t, tables_t[i], scale, cfg.causal,
                                             fm_meta, fm_splits)[:2]

        def call_fa3(i):
            return fa3.fwd(q_rope, k_cache, v_cache, q_v=q_nope, seqused_k=lens_t, page_table=tables_t[i],
                           softmax_scale=scale, is_causal=cfg.causal, scheduler_metadata=fa_meta,
                           num_splits=0)[:2]

        decode = lambda q, c, t, s, sch: jax_mla.mla_decode(q, c, t, s, causal=cfg.causal,  # noqa: E731
                                                            return_lse=True, schedule=sch)

        # The FP8 cache of the same rows (issue #36): jax_mla alone reads it.
        cache_fp8 = jax.jit(jax_mla.pack_fp8_kv)(cache.astype(jnp.float32)) if args.fp8 else None

        # --- agreement: one call of each on table 0; float64 reference for the first and last request ---
        out_j, lse_j = jax.jit(decode)(q, cache, tables[0], seq_lens, sched)
        got = {"jax_mla": (np.asarray(out_j, np.float32), np.asarray(lse_j))}
        if args.fp8:
            out_f, lse_f = jax.jit(decode)(q, cache_fp8, tables[0], seq_lens, sched)
            got["jax_mla[fp8]"] = (np.asarray(out_f, np.float32), np.asarray(lse_f))
        for name, fn in (("flashmla", call_flashmla), ("fa3", call_fa3)):
            o, l = fn(0)
            got[name] = (o.float().cpu().numpy(), l.float().permute(0, 2, 1).cpu().numpy())  # lse (b, h, s_q)
        torch.cuda.synchronize()
        agree = {}
        for a in IMPLS:
            for b in IMPLS:
                if a < b:
                    oa, ob = got[a][0], got[b][0]
                    agree[f"{a}~{b}"] = dict(
                        out_rel=float(np.linalg.norm(oa - ob) / np.linalg.norm(ob)),
                        lse_max_abs=float(np.abs(got[a][1] - got[b][1]).max()))
        q_h, table_h = np.asarray(q, np.float32), np.asarray(tables[0])
        lens_h = cfg.seq_lens()
        ref_err = {name: 0.0 for name in impls}
        ref_lse = {name: 0.0 for name in impls}
        for r in sorted({0, cfg.batch - 1}):
            if lens_h[r] == 0:
                continue  # no key: nothing for a relative error to measure
            # Only this request's pages come to the host (the cache can be gigabytes).
            pages = table_h[r][: -(-int(lens_h[r]) // PAGE_SIZE)]
            kv_rows = np.asarray(cache[jnp.asarray(pages)], np.float32)  # (pages, page, 576)
            ref_o, ref_l = reference_request(q_h[r], kv_rows, np.arange(len(pages)), int(lens_h[r]), cfg.causal,
                                             scale)
            refs = {name: (ref_o, ref_l) for name in IMPLS}
            if args.fp8:  # the reference on the dequantized rows
                rows_fp8 = np.asarray(jax_mla.unpack_fp8_kv(cache_fp8[jnp.asarray(pages)]), np.float32)
                refs["jax_mla[fp8]"] = reference_request(q_h[r], rows_fp8, np.arange(len(pages)), int(lens_h[r]),
                                                         cfg.causal, scale)
            for name in impls:
                o, l = got[name][0][r], got[name][1][r]
                ro, rl = refs[name]
                ref_err[name] = max(ref_err[name], float(np.linalg.norm(o - ro) / np.linalg.norm(ro)))
                ref_lse[name] = max(ref_lse[name], float(np.abs(l - rl).max()))
        del got
        bad = [n for n in impls if not (ref_err[n] <= MAX_OUT_REL_ERR and ref_lse[n] <= MAX_LSE_ABS_ERR)]
        if bad:
            print(f"# {cfg.name}: CHECK FAILED for {bad}: out rel err {ref_err}, LSE abs err {ref_lse}", flush=True)
            failed.append((cfg.name, bad))
        if args.profile:
            profile_once(cfg, call_flashmla, call_fa3, decode, (q, cache, tables[1], seq_lens, sched))
            continue

        # --- the timed steps ---
        def jax_step(q, cache, tables, seq_lens, sch):
            acc = jnp.zeros((), jnp.float32)
            for i in range(calls):
                out = jax_mla.mla_decode(q, cache, tables[i], seq_lens, causal=cfg.causal, schedule=sch)
                acc = acc + out[0, 0, 0, i % 512].astype(jnp.float32)
            return acc
        jstep = jax.jit(jax_step)
        args_of = {"jax_mla": (q, cache, tables, seq_lens, sched)}
        if args.fp8:
            args_of["jax_mla[fp8]"] = (q, cache_fp8, tables, seq_lens, sched)

        graphs = {"flashmla": capture_graph(call_flashmla, calls), "fa3": capture_graph(call_fa3, calls)}

        def run(name):
            t0 = time.perf_counter()
            if name in args_of:
                jax.block_until_ready(jstep(*args_of[name]))
            else:
                graphs[name].replay()
                torch.cuda.synchronize()
            return (time.perf_counter() - t0) / calls * 1e6

        times = time_interleaved(run, impls, args.repeats)
        us = {name: sorted(t)[len(t) // 2] for name, t in times.items()}
        best_peer = min(us["flashmla"], us["fa3"])
        row = dict(name=cfg.name, batch=cfg.batch, seq_q=cfg.seq_q, heads=cfg.heads, causal=cfg.causal,
                   tokens=int(cfg.seq_lens().sum()), calls=calls, sets=num_sets, us=us,
                   spread={n: (min(t), max(t)) for n, t in times.items()},
                   ratio_to_best_peer=us["jax_mla"] / best_peer,
                   gbps={n: cfg.bytes(656 if n == "jax_mla[fp8]" else 2 * 576) / (u * 1e-6) / 1e9
                         for n, u in us.items()},
                   tflops={n: cfg.flops() / (u * 1e-6) / 1e12 for n, u in us.items()},
                   agreement=agree, ref_out_rel=ref_err, ref_lse_max_abs=ref_lse)
        rows.append(row)
        if args.fp8:
            row["fp8_ratio_to_best_peer"] = us["jax_mla[fp8]"] / best_peer
        print(f"# {cfg.name:<26} " + "  ".join(f"{n} {us[n]:7.1f}" for n in impls)
              + f"  ratio {row['ratio_to_best_peer']:.2f}  (calls {calls}, sets {num_sets}, "
              f"{time.perf_counter() - t_cfg:.0f} s)", flush=True)
        dump_json(partial=True)
        # Drop this config's buffers before the next one's (rebinding, not del: the closures above
        # still name them).
        graphs = jstep = args_of = cache_fp8 = q = cache = tables = seq_lens = None
        q_t = cache_t = tables_t = lens_t = kcache4 = None
        q_nope = q_rope = v_cache = k_cache = fm_meta = fm_splits = fa_meta = None
        torch.cuda.empty_cache()

    print()
    print(f"# {device}; us per call (median of {args.repeats} interleaved rounds); ratio = jax_mla / best peer")
    print(f"{'config':<26} {'FlashMLA':>9} {'FA3':>9} {'jax_mla':>9} {'ratio':>6} | GB/s FlashMLA/FA3/jax_mla"
          f" | TFLOP/s FlashMLA/FA3/jax_mla")
    for r in rows:
        print(f"{r['name']:<26} {r['us']['flashmla']:9.1f} {r['us']['fa3']:9.1f} {r['us']['jax_mla']:9.1f} "
              f"{r['ratio_to_best_peer']:6.2f} | " + "/".join(f"{r['gbps'][n]:.0f}" for n in IMPLS)
              + " | " + "/".join(f"{r['tflops'][n]:.0f}" for n in IMPLS))
    if args.fp8:
        print()
        print(f"{'config':<26} {'jax_mla[fp8]':>12} {'ratio':>6} (to the best bf16 peer) | GB/s in FP8 bytes | TFLOP/s")
        for r in rows:
            print(f"{r['name']:<26} {r['us']['jax_mla[fp8]']:12.1f} {r['fp8_ratio_to_best_peer']:6.2f} | "
                  f"{r['gbps']['jax_mla[fp8]']:.0f} | {r['tflops']['jax_mla[fp8]']:.0f}")
    print()
    print(f"{'config':<26} agreement: out rel err, LSE max abs diff | vs float64 (first, last request): out rel err")
    for r in rows:
        a = "  ".join(f"{k} {v['out_rel']:.1e}/{v['lse_max_abs']:.1e}" for k, v in r["agreement"].items())
        e = " ".join(f"{n} {r['ref_out_rel'][n]:.1e}" for n in r["ref_out_rel"])
        print(f"{r['name']:<26} {a} | {e}")
    dump_json(partial=False)
    if failed:
        print(f"CHECK FAILED: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
