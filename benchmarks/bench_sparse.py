"""jax_mla's sparse decode against FlashMLA's SM90 sparse FP8 decode (issue #37), one process, same buffers.

Issue #37's target: jax_mla.mla_decode_sparse at <= 1.0x the time of FlashMLA's SM90 sparse FP8
decode (deepseek-ai/FlashMLA 9241ae3, built from its sources by benchmarks/peers/, PEERS=sparse) on
the same card, for b = 128, h_q 128 and 64, s_q 1 and 2, topk 2048, contexts 32K and 64K.

Per config, three columns, timed in one process on the same buffers (jax arrays, handed to torch by
DLPack without a copy):
- flashmla: FlashMLA's V3.2 sparse decode (`flashmla_sparse.sparse_decode_fwd`, our binding of its
  sparse_attn_decode_interface) on the FP8 cache uint8 [num_blocks, 64, 1, 656];
- jax_mla: jax_mla.mla_decode_sparse on the same FP8 cache (its [num_pages, 64, 656] view) and the
  same indices;
- jax_mla_bf16: jax_mla.mla_decode_sparse on a bf16 cache holding the same rows
  (unpack_fp8_kv(fp8 cache), exact), for reference: what the FP8 format saves or costs jax_mla.
The ratio is jax_mla / flashmla (both on the FP8 cache).

Inputs (build_cache / draw_indices):
- One cache per context: b * context / 64 pages of 64 tokens, random normal rows packed by
  jax_mla.pack_fp8_kv (FlashMLA's V3.2 layout: 512 e4m3 bytes, 4 fp32 power-of-two scales, 64 bf16
  RoPE values; the same scale rule as FlashMLA's tests/quant.py, 2^ceil(log2(amax / 448)), so its
  bf16 dequantization is exact). FlashMLA's layout needs page_block_size 64 for nothing but the
  view; its kernel reads any page size whose rows are 656 bytes apart.
- Each timed call i has its own indices: a fresh shuffle of all pages into per-request block tables
  (request r owns context / 64 pages), then for each request and query token 2048 distinct random
  token positions of the request's context (the top 2048 of uniform draws, as FlashMLA's own test
  generator _randperm_batch does; unsorted), mapped to flat slots block * 64 + row. The s_q tokens
  of a request draw independently (overlapping by chance). A call reads b * s_q * 2048 random rows
  (172 MB of FP8 rows at s_q 1) out of a 2.7 GB (32K) or 5.5 GB (64K) cache, and the next call
  reads another random set, so about L2 / cache (1-2%) of a call's rows can still be in L2.
- q: one random bf16 [b, s_q, h_q, 576] per config (as bench_peers.py). softmax scale 576 ** -0.5
  for both (FlashMLA's Python default is q.shape[-1] ** -0.5, the same number).

Method (as bench_peers.py; docs/performance.md):
- Plans computed once: FlashMLA's scheduler metadata comes from one untimed call with None (as its
  flash_mla_with_kvcache does on first use; it depends on b, s_q, h_q and topk only), then every
  call passes it back. jax_mla's sparse path has no schedule argument: its device scheduler plans
  inside the op, so that cost is part of every jax_mla call.
- A step is `calls` back-to-back calls in one CUDA graph (jax: one jitted step, captured by XLA as a
  command buffer; FlashMLA: torch.cuda.CUDAGraph), calls chosen so that a step lasts >= ~3 ms at
  the roofline floor (8..64). Steps are timed on the host clock, launch to synchronisation, in
  interleaved rounds (flashmla, jax_mla, jax_mla_bf16, flashmla, ...), after two warm-up steps
  each; the time per call is the median over rounds of step time / calls.
- Counting (FlashMLA's tests/lib.py count_flop_and_mem_vol_for_decode): FLOPs = 2 h_q s_q topk
  (576 + 512) per request; bytes = the distinct selected rows (656 bytes each in FP8, 1152 in
  bf16; counted per call, averaged over the step's calls) + q and out in bf16.
- Agreement, before timing, on the first call's indices: out relative error (L2) and LSE max abs
  difference between each pair, and each against a float64 reference of the first and last
  request (tests/cases.py sparse_brute_force on the unpacked selected rows). jax_mla on the FP8
  cache and on the bf16 cache of the same rows should agree bit for bit (docs/design.md).

FlashMLA's conventions (csrc/api/sparse_decode.h, csrc/sm90/decode/sparse_fp8/splitkv_mla.cuh,
csrc/smxx/decode/combine/combine.cu, flash_mla/flash_mla_interface.py, tests/ref.py; 9241ae3):
- lse is returned as [b, h_q, s_q], a transposed view of a [b, s_q, h_q] buffer; natural log (the
  kernels work in base 2 and divide by log2(e) when writing). A query token with no valid index
  gets lse = +inf (jax_mla: -inf) and out = 0 (both).
- -1 is the only index the V3.2 SM90 kernel skips (its score is masked to -inf and the row is
  zero-filled); other out-of-range indices are not checked (the kernel reads whatever the address
  holds). The benchmark's indices are all valid.
- topk_length: the V3.2 SM90 kernel refuses it (KU_ASSERT(params.topk_length == nullptr), "V3.2
  does not support dynamic topk length"); only MODEL1 (d_qk 512) takes it. Not timed here.
- topk must be a multiple of 64, h_q 64 or 128 (one 64-head block per CTA, a 2-CTA cluster for 128).
- attn_sink [h_q] float32: out *= exp(lse) / (exp(lse) + exp(sink)), lse unchanged (applied by the
  decode kernel for unsplit requests, by the combine for split ones): jax_mla's definition.
  --attn-sink times both with a random sink (V3.2 itself has none).
- Dequantization: scales cast to bf16, e4m3 * scale in bf16 (exact for power-of-two scales), P
  rounded to bf16 before P V, fp32 accumulation.

Usage: python benchmarks/bench_sparse.py [--peers .peers/lib] [--only NAME[,NAME...]] [--repeats 15]
                                         [--json out.json] [--label TEXT] [--attn-sink] [--dry-run]
--dry-run: no GPU, no torch, no FlashMLA: builds the inputs on the CPU at a small size (b 2,
context 2K, topk 128), checks the index construction and the FLOP / byte arithmetic, runs
jax_mla's CPU kernel for the agreement check and prints the table skeleton (FlashMLA: "-").
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.append(os.path.join(HERE, "..", "tests"))  # cases.py: sparse_brute_force
# torch and jax share the GPU: jax must not take 75% of its memory up front.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

from bench_peers import capture_graph, time_interleaved  # noqa: E402

PAGE_SIZE = 64
HEAD_DIM_QK, HEAD_DIM_V = 576, 512
FP8_ROW_BYTES = 656           # 512 e4m3 + 4 fp32 scales + 64 bf16 (FlashMLA's V3.2 bytes_per_token)
BF16_ROW_BYTES = 2 * HEAD_DIM_QK
SCALE = HEAD_DIM_QK ** -0.5
IMPLS = ("flashmla", "jax_mla", "jax_mla_bf16")
ROW_BYTES = {"flashmla": FP8_ROW_BYTES, "jax_mla": FP8_ROW_BYTES, "jax_mla_bf16": BF16_ROW_BYTES}
# As bench_peers.py: outputs of bf16 inputs agree with a float64 reference to ~3e-3; NaN fails.
MAX_OUT_REL_ERR = 2e-2
MAX_LSE_ABS_ERR = 1e-3
# The fallback ceilings (an H200's, benchmarks/configs.py) when not measured.
COPY_GBPS = 4274.0
MATMUL_TFLOPS = 685.0


@dataclasses.dataclass(frozen=True)
class SparseConfig:
    batch: int
    seq_q: int
    heads: int
    context: int   # tokens per request (its pages: context / 64)
    topk: int

    @property
    def name(self) -> str:
        return f"b{self.batch}_sq{self.seq_q}_h{self.heads}_{self.context // 1024}k_top{self.topk}"

    @property
    def pages_per_request(self) -> int:
        return self.context // PAGE_SIZE

    @property
    def num_pages(self) -> int:
        return self.batch * self.pages_per_request

    def flops(self) -> float:
        """2 h_q s_q topk (576 + 512) per request (FlashMLA's count_flop_and_mem_vol_for_decode)."""
        return 2.0 * self.batch * self.seq_q * self.heads * self.topk * (HEAD_DIM_QK + HEAD_DIM_V)

    def qo_bytes(self) -> float:
        """q read and out written once, in bf16."""
        return 2.0 * self.batch * self.seq_q * self.heads * (HEAD_DIM_QK + HEAD_DIM_V)

    def bytes(self, distinct_rows: float, row_bytes: int = FP8_ROW_BYTES) -> float:
        """The distinct selected rows, once each, plus q and out."""
        return distinct_rows * row_bytes + self.qo_bytes()

    def floor_us(self, copy_gbps: float, matmul_tflops: float) -> float:
        rows = self.batch * self.seq_q * self.topk  # at most; s_q 2 overlaps a little
        return max(self.bytes(rows) / (copy_gbps * 1e3), self.flops() / (matmul_tflops * 1e6))

    def calls_per_step(self, copy_gbps: float, matmul_tflops: float, step_us: float = 3000.0,
                       lo: int = 8, hi: int = 64) -> int:
        return int(min(hi, max(lo, -(-step_us // self.floor_us(copy_gbps, matmul_tflops)))))


# Ordered by context, so that each context's cache is built once.
CONFIGS = [SparseConfig(128, s_q, h, ctx, 2048) for ctx in (32768, 65536) for h in (128, 64) for s_q in (1, 2)]
DRY_CONFIGS = [SparseConfig(2, s_q, h, 2048, 128) for h in (128, 64) for s_q in (1, 2)]


def check_arithmetic() -> None:
    """The counting, on numbers worked by hand."""
    c = SparseConfig(128, 1, 128, 32768, 2048)
    assert c.name == "b128_sq1_h128_32k_top2048", c.name
    assert c.pages_per_request == 512 and c.num_pages == 65536
    # 2 * 128 * 2048 * 1088 = 570,425,344 FLOPs a request; 128 requests: 73.0 GFLOP
    assert c.flops() == 128 * 570_425_344 == 73_014_444_032
    # q + out: 2 * 128 * 128 * 1088 bytes = 35,651,584
    assert c.qo_bytes() == 35_651_584
    # 262,144 distinct FP8 rows = 171,966,464 bytes; + q and out
    assert c.bytes(128 * 2048) == 171_966_464 + 35_651_584
    assert c.bytes(128 * 2048, BF16_ROW_BYTES) == 301_989_888 + 35_651_584
    c2 = SparseConfig(128, 2, 64, 65536, 2048)
    assert c2.flops() == 73_014_444_032 and c2.num_pages == 131072
    # H100 ceilings (docs/performance.md): 2870 GB/s, 663 TFLOP/s: compute floor 110 us at h128 s_q 1
    assert abs(c.floor_us(2870, 663) - 73_014_444_032 / 663e6) < 1e-6
    assert c.calls_per_step(2870, 663) == 28
    assert len(CONFIGS) == 8 and len({x.name for x in CONFIGS}) == 8


def build_cache(cfg: SparseConfig, seed: int, with_bf16: bool = True):
    """(fp8 cache uint8 [num_pages, 64, 656], bf16 cache [num_pages, 64, 576] = unpack_fp8_kv of it
    or None): random normal rows, packed chunk by chunk into preallocated buffers (the float32 rows
    of a 64K cache would be 19 GB)."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    import jax_mla
    n = cfg.num_pages
    chunk = math.gcd(n, 2048)
    fp8 = jnp.zeros((n, PAGE_SIZE, FP8_ROW_BYTES), jnp.uint8)
    bf16 = jnp.zeros((n, PAGE_SIZE, HEAD_DIM_QK), jnp.bfloat16) if with_bf16 else None
    make = jax.jit(lambda k: jax_mla.pack_fp8_kv(jax.random.normal(k, (chunk, PAGE_SIZE, HEAD_DIM_QK), jnp.float32)))
    unpack = jax.jit(lambda p: jax_mla.unpack_fp8_kv(p, jnp.bfloat16))
    put = jax.jit(lambda buf, x, i: lax.dynamic_update_slice_in_dim(buf, x, i, 0), donate_argnums=0)
    key = jax.random.PRNGKey(seed)
    for start in range(0, n, chunk):
        part = make(jax.random.fold_in(key, start))
        fp8 = put(fp8, part, start)
        if with_bf16:
            bf16 = put(bf16, unpack(part), start)
    return jax.block_until_ready(fp8), bf16


def make_index_drawer(cfg: SparseConfig):
    """A jitted key -> (indices int32 [b, s_q, topk], block table [b, pages_per_request], distinct
    rows): a fresh shuffle of all pages into per-request block tables, then per (request, query
    token) topk distinct random positions of the request's context (the top topk of uniform draws,
    FlashMLA's _randperm_batch), mapped through the table to slots block * 64 + row."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    b, s_q, ppr = cfg.batch, cfg.seq_q, cfg.pages_per_request

    def draw(key):
        k_table, k_pos = jax.random.split(key)
        table = jax.random.permutation(k_table, cfg.num_pages).astype(jnp.int32).reshape(b, ppr)
        pos = lax.top_k(jax.random.uniform(k_pos, (b, s_q, cfg.context)), cfg.topk)[1].astype(jnp.int32)
        pages = jnp.take_along_axis(jnp.broadcast_to(table[:, None, :], (b, s_q, ppr)), pos // PAGE_SIZE, axis=2)
        slots = pages * PAGE_SIZE + pos % PAGE_SIZE
        # Distinct rows: requests own disjoint pages, so count within each request.
        srt = jnp.sort(slots.reshape(b, s_q * cfg.topk), axis=1)
        distinct = b + jnp.sum(srt[:, 1:] != srt[:, :-1])
        return slots, table, distinct

    return jax.jit(draw)


def check_indices(cfg: SparseConfig, slots, table, distinct) -> None:
    """The dry run's checks of one draw: every slot in range, in a page of its own request, the
    topk slots of each query token distinct, and the distinct count right."""
    import numpy as np
    slots, table = np.asarray(slots), np.asarray(table)
    assert slots.shape == (cfg.batch, cfg.seq_q, cfg.topk) and slots.dtype == np.int32
    assert slots.min() >= 0 and slots.max() < cfg.num_pages * PAGE_SIZE
    assert sorted(table.reshape(-1).tolist()) == list(range(cfg.num_pages)), "the tables are not a shuffle"
    owner = np.empty(cfg.num_pages, np.int64)
    owner[table.reshape(-1)] = np.repeat(np.arange(cfg.batch), cfg.pages_per_request)
    assert (owner[slots // PAGE_SIZE] == np.arange(cfg.batch)[:, None, None]).all(), "a slot outside its request"
    for r in range(cfg.batch):
        for t in range(cfg.seq_q):
            assert np.unique(slots[r, t]).size == cfg.topk, "repeated slot within a query token"
    want = sum(np.unique(slots[r]).size for r in range(cfg.batch))
    assert int(distinct) == want, (int(distinct), want)


def reference_requests(cfg: SparseConfig, q, cache_fp8, idx, sink, requests):
    """float64 (out [s_q, h, 512], lse [s_q, h]) of each of `requests`, from its selected rows only
    (unpack_fp8_kv of the gathered FP8 rows; tests/cases.py sparse_brute_force)."""
    import jax.numpy as jnp
    import numpy as np

    import jax_mla
    from cases import sparse_brute_force
    flat = cache_fp8.reshape(-1, FP8_ROW_BYTES)
    idx_h = np.asarray(idx)
    sink_h = None if sink is None else np.asarray(sink, np.float64)
    res = {}
    for r in requests:
        uniq, inv = np.unique(idx_h[r], return_inverse=True)
        rows = np.asarray(jax_mla.unpack_fp8_kv(flat[jnp.asarray(uniq.astype(np.int32))], jnp.float32), np.float64)
        q_r = np.asarray(q[r:r + 1].astype(jnp.float32), np.float64)
        out, lse = sparse_brute_force(q_r, rows, inv.reshape(1, cfg.seq_q, cfg.topk), None, SCALE, sink_h)
        res[r] = (out[0], lse[0])
    return res


def load_flashmla(lib_dir: str):
    spec = importlib.util.spec_from_file_location("flashmla_sparse", os.path.join(lib_dir, "flashmla_sparse.so"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    pins = [p for p in open(os.path.join(lib_dir, "PINS")).read().split("\n") if p]
    return mod, pins


def fmt(x, spec: str) -> str:
    """format(x, spec), or "-" in the same width for a missing number."""
    if x is not None:
        return format(x, spec)
    width = spec.split(".")[0]
    return format("-", ">" + width) if width else "-"


def print_tables(rows, device: str, repeats: int) -> None:
    print()
    print(f"# {device}; us per call (median of {repeats} interleaved rounds); ratio = jax_mla / FlashMLA "
          f"(both on the FP8 cache); jax_mla bf16: the same rows in a bf16 cache")
    print(f"{'config':<28} {'FlashMLA':>9} {'jax_mla':>9} {'ratio':>6} {'jax bf16':>9} | TFLOP/s FlashMLA/jax_mla/bf16"
          f" | GB/s FlashMLA/jax_mla/bf16")
    for r in rows:
        us, tf, gb = r["us"], r["tflops"], r["gbps"]
        print(f"{r['name']:<28} {fmt(us['flashmla'], '9.1f')} {fmt(us['jax_mla'], '9.1f')} "
              f"{fmt(r['ratio'], '6.2f')} {fmt(us['jax_mla_bf16'], '9.1f')} | "
              + "/".join(fmt(tf[n], ".0f") for n in IMPLS) + " | " + "/".join(fmt(gb[n], ".0f") for n in IMPLS))
    print()
    print(f"{'config':<28} agreement: out rel err / LSE max abs diff | vs float64 (first, last request): "
          f"out rel err / LSE max abs err")
    for r in rows:
        a = "  ".join(f"{k} {v['out_rel']:.1e}/{v['lse_max_abs']:.1e}" for k, v in r["agreement"].items())
        e = "  ".join(f"{n} {r['ref_out_rel'][n]:.1e}/{r['ref_lse_max_abs'][n]:.1e}" for n in r["ref_out_rel"])
        print(f"{r['name']:<28} {a} | {e}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--peers", default=os.path.join(HERE, "..", ".peers", "lib"),
                    help="folder with flashmla_sparse.so and PINS (PEERS=sparse benchmarks/peers/build.sh)")
    ap.add_argument("--only", default=None, help="comma-separated substrings of config names")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--json", default=None)
    ap.add_argument("--label", default="", help="recorded in the JSON (e.g. the jax_mla commit)")
    ap.add_argument("--attn-sink", action="store_true", help="time both with a random attn_sink [h_q]")
    ap.add_argument("--no-ceilings", action="store_true",
                    help="size the steps with the fallback ceilings instead of measuring this GPU's")
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU only, small sizes, no FlashMLA: inputs, checks and the table skeleton")
    args = ap.parse_args()
    check_arithmetic()
    dry = args.dry_run
    if dry:
        os.environ["JAX_PLATFORMS"] = "cpu"
    else:
        from bench_decode import _setup_xla_flags
        _setup_xla_flags(True)

    import jax
    import jax.numpy as jnp
    import numpy as np

    import jax_mla

    torch = fm = None
    pins = []
    if dry:
        device = f"CPU dry run ({jax.devices()[0].device_kind}): timings mean nothing"
        impls = ("jax_mla", "jax_mla_bf16")
        copy_gbps, mm_tflops = COPY_GBPS, MATMUL_TFLOPS
    else:
        import torch
        fm, pins = load_flashmla(args.peers)
        device = torch.cuda.get_device_name()
        impls = IMPLS
        if args.no_ceilings:
            copy_gbps, mm_tflops = COPY_GBPS, MATMUL_TFLOPS
        else:
            from bench_decode import measure_ceilings
            copy_gbps, mm_tflops = measure_ceilings()
    print(f"# {device}; jax {jax.__version__}, jax_mla {jax_mla.__version__}"
          + ("" if torch is None else f", torch {torch.__version__}") + f" {args.label}", flush=True)
    for p in pins:
        print(f"# peer {p}", flush=True)
    print(f"# ceilings for sizing the steps: copy {copy_gbps:.0f} GB/s, bf16 matmul {mm_tflops:.0f} TFLOP/s"
          f"{' (fallback)' if dry or args.no_ceilings else ' (measured)'}; attn_sink {'on' if args.attn_sink else 'off'}",
          flush=True)

    rows, failed = [], []

    def dump_json(partial: bool) -> None:
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(device_kind=device, jax_version=jax.__version__, jax_mla_version=jax_mla.__version__,
                               torch_version=None if torch is None else torch.__version__, label=args.label,
                               peers=pins, copy_gbps=copy_gbps, matmul_tflops=mm_tflops, attn_sink=args.attn_sink,
                               dry_run=dry, partial=partial, argv=sys.argv[1:], rows=rows), f, indent=1)

    named = args.only.split(",") if args.only else []
    configs = [c for c in (DRY_CONFIGS if dry else CONFIGS) if not named or any(o and o in c.name for o in named)]
    caches = (None, None, None)  # (context, fp8, bf16): rebuilt when the context changes
    cache_fp8 = cache_bf16 = None
    for ci, cfg in enumerate(configs):
        t_cfg = time.perf_counter()
        if caches[0] != cfg.context:
            caches = cache_fp8 = cache_bf16 = None  # the previous context's caches go first
            if torch is not None:
                torch.cuda.empty_cache()
            fp8, bf16 = build_cache(cfg, seed=cfg.context)
            caches = (cfg.context, fp8, bf16)
        _, cache_fp8, cache_bf16 = caches
        calls = 2 if dry else cfg.calls_per_step(copy_gbps, mm_tflops)
        key = jax.random.PRNGKey(1000 + ci)
        k_q, k_sink, k_idx = jax.random.split(key, 3)
        q = jax.random.normal(k_q, (cfg.batch, cfg.seq_q, cfg.heads, HEAD_DIM_QK), jnp.float32).astype(jnp.bfloat16)
        # A sink around the rows' LSE (log 2048 ~ 7.6 plus the scores' spread), so that it matters.
        sink = (jax.random.normal(k_sink, (cfg.heads,), jnp.float32) * 2 + 8) if args.attn_sink else None
        draw = make_index_drawer(cfg)
        drawn = [draw(jax.random.fold_in(k_idx, i)) for i in range(calls)]
        idx_all = jnp.stack([d[0] for d in drawn])            # [calls, b, s_q, topk]
        distinct = float(np.mean([int(d[2]) for d in drawn]))  # distinct rows a call, averaged
        if dry:
            check_indices(cfg, *drawn[0])
        del drawn

        # --- one call of each on the first call's indices: agreement and the float64 reference ---
        one = jax.jit(lambda q, c, i, s: jax_mla.mla_decode_sparse(q, c, i, attn_sink=s, return_lse=True))
        got = {}
        for name, cache in (("jax_mla", cache_fp8), ("jax_mla_bf16", cache_bf16)):
            o, l = one(q, cache, idx_all[0], sink)
            got[name] = (np.asarray(o, np.float32), np.asarray(l, np.float32))
        if fm is not None:
            jax.block_until_ready((q, idx_all, sink))  # torch reads them on its own stream
            q_t, idx_t = torch.from_dlpack(q), torch.from_dlpack(idx_all)
            kv_t = torch.from_dlpack(cache_fp8).view(cfg.num_pages, PAGE_SIZE, 1, FP8_ROW_BYTES)
            sink_t = None if sink is None else torch.from_dlpack(sink)
            # The plan: one untimed call with no metadata (FlashMLA's get_mla_metadata + first call).
            o, l, fm_meta, fm_splits = fm.sparse_decode_fwd(q_t, kv_t, idx_t[0], None, sink_t, None, None,
                                                            softmax_scale=SCALE)
            # lse comes as [b, h_q, s_q] (a transposed view): back to [b, s_q, h_q].
            got["flashmla"] = (o.float().cpu().numpy(), l.transpose(1, 2).float().cpu().numpy())
            torch.cuda.synchronize()
            del o, l

            def call_flashmla(i):
                return fm.sparse_decode_fwd(q_t, kv_t, idx_t[i], None, sink_t, fm_meta, fm_splits,
                                            softmax_scale=SCALE)[:2]
        agree = {}
        for a in impls:
            for b in impls:
                if a < b:
                    oa, ob = got[a][0], got[b][0]
                    agree[f"{a}~{b}"] = dict(out_rel=float(np.linalg.norm(oa - ob) / np.linalg.norm(ob)),
                                             lse_max_abs=float(np.abs(got[a][1] - got[b][1]).max()))
        ref = reference_requests(cfg, q, cache_fp8, idx_all[0], sink, sorted({0, cfg.batch - 1}))
        ref_err = {n: 0.0 for n in impls}
        ref_lse = {n: 0.0 for n in impls}
        for r, (ref_o, ref_l) in ref.items():
            for n in impls:
                ref_err[n] = max(ref_err[n], float(np.linalg.norm(got[n][0][r] - ref_o) / np.linalg.norm(ref_o)))
                ref_lse[n] = max(ref_lse[n], float(np.abs(got[n][1][r] - ref_l).max()))
        del got
        bad = [n for n in impls if not (ref_err[n] <= MAX_OUT_REL_ERR and ref_lse[n] <= MAX_LSE_ABS_ERR)]
        if bad:
            print(f"# {cfg.name}: CHECK FAILED for {bad}: out rel err {ref_err}, LSE abs err {ref_lse}", flush=True)
            failed.append((cfg.name, bad))

        # --- the timed steps ---
        def jax_step(q, cache, idx_all, sink):
            acc = jnp.zeros((), jnp.float32)
            for i in range(calls):
                out = jax_mla.mla_decode_sparse(q, cache, idx_all[i], attn_sink=sink)
                acc = acc + out[0, 0, 0, i % HEAD_DIM_V].astype(jnp.float32)
            return acc
        jstep = jax.jit(jax_step)
        graphs = {}
        if fm is not None:
            graphs["flashmla"] = capture_graph(call_flashmla, calls)

        def run(name):
            t0 = time.perf_counter()
            if name == "flashmla":
                graphs[name].replay()
                torch.cuda.synchronize()
            else:
                cache = cache_fp8 if name == "jax_mla" else cache_bf16
                jax.block_until_ready(jstep(q, cache, idx_all, sink))
            return (time.perf_counter() - t0) / calls * 1e6

        times = time_interleaved(run, impls, 1 if dry else args.repeats)
        us = {n: (sorted(times[n])[len(times[n]) // 2] if n in times else None) for n in IMPLS}
        row = dict(name=cfg.name, batch=cfg.batch, seq_q=cfg.seq_q, heads=cfg.heads, context=cfg.context,
                   topk=cfg.topk, calls=calls, distinct_rows=distinct, flops=cfg.flops(),
                   bytes={n: cfg.bytes(distinct, ROW_BYTES[n]) for n in IMPLS}, us=us,
                   spread={n: (min(t), max(t)) for n, t in times.items()},
                   ratio=None if us["flashmla"] is None else us["jax_mla"] / us["flashmla"],
                   tflops={n: None if us[n] is None else cfg.flops() / (us[n] * 1e-6) / 1e12 for n in IMPLS},
                   gbps={n: None if us[n] is None else cfg.bytes(distinct, ROW_BYTES[n]) / (us[n] * 1e-6) / 1e9
                         for n in IMPLS},
                   agreement=agree, ref_out_rel=ref_err, ref_lse_max_abs=ref_lse)
        rows.append(row)
        print(f"# {cfg.name:<28} " + "  ".join(f"{n} {fmt(us[n], '7.1f')}" for n in IMPLS)
              + f"  ratio {fmt(row['ratio'], '.2f')}  (calls {calls}, distinct rows {distinct:.0f}, "
              f"{time.perf_counter() - t_cfg:.0f} s)", flush=True)
        dump_json(partial=True)
        # Drop this config's buffers before the next one's (rebinding, not del: closures name them).
        graphs = jstep = q = idx_all = sink = None
        if fm is not None:
            q_t = idx_t = kv_t = sink_t = fm_meta = fm_splits = call_flashmla = None
            torch.cuda.empty_cache()

    print_tables(rows, device, 1 if dry else args.repeats)
    dump_json(partial=False)
    if failed:
        print(f"CHECK FAILED: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
