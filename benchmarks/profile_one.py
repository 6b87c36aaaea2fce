"""Runs one benchmark configuration a few times, for a profiler (ncu) to attach to.

  ncu --clock-control none -k regex:decode_kernel -c 1 --section SpeedOfLight ... \
      python3 benchmarks/profile_one.py b128_sq1_h128_4k

PROFILE_NUM_PARTS=N plans the split-KV schedule with N parts (decode_schedule) instead of the default.
PROFILE_CACHE=fp8 runs over the FP8 cache of the same rows (pack_fp8_kv) instead of the bf16 one.
A configuration of benchmarks/bench_sparse.py (e.g. b128_sq1_h64_32k_top2048) runs
mla_decode_sparse on its inputs instead (PROFILE_CACHE as above; PROFILE_NUM_PARTS does not apply):

  NCUSRC_CONFIG=b128_sq1_h64_32k_top2048 NCUSRC_VARIANTS="PROFILE_CACHE=fp8 PROFILE_CACHE=bf16" \
      bash benchmarks/device_run.sh ncusrc
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import numpy as np  # noqa: E402

import jax_mla  # noqa: E402
from bench_decode import build_inputs  # noqa: E402
import configs  # noqa: E402


def run_sparse(name: str) -> int:
    """Three calls of mla_decode_sparse on bench_sparse.py's inputs for that configuration."""
    import bench_sparse
    cfg = next(c for c in bench_sparse.CONFIGS if c.name == name)
    fp8 = os.environ.get("PROFILE_CACHE", "bf16") == "fp8"
    cache_fp8, cache_bf16 = bench_sparse.build_cache(cfg, 0, with_bf16=not fp8)
    cache = cache_fp8 if fp8 else cache_bf16
    del cache_fp8, cache_bf16
    slots, _, _ = bench_sparse.make_index_drawer(cfg)(jax.random.PRNGKey(1))
    q = jax.random.normal(jax.random.PRNGKey(2), (cfg.batch, cfg.seq_q, cfg.heads, bench_sparse.HEAD_DIM_QK),
                          jax.numpy.bfloat16)
    fn = jax.jit(lambda q, c, i: jax_mla.mla_decode_sparse(q, c, i, softmax_scale=bench_sparse.SCALE))
    for _ in range(3):
        jax.block_until_ready(fn(q, cache, slots))
    print("ran", name, "fp8" if fp8 else "bf16")
    return 0


def main() -> int:
    name = sys.argv[1] if len(sys.argv) > 1 else "b128_sq1_h128_4k"
    if "_top" in name:
        return run_sparse(name)
    cfg = configs.find(name)
    q, cache, tables, seq_lens = build_inputs(cfg, np.random.default_rng(0), jax.numpy, np, 2, 2)
    if os.environ.get("PROFILE_CACHE", "bf16") == "fp8":
        cache = jax_mla.pack_fp8_kv(cache)
    parts = int(os.environ.get("PROFILE_NUM_PARTS", "0"))  # 0: the op plans with the default part count

    def step(q, c, t, s):
        sched = jax_mla.decode_schedule(s, num_heads=cfg.heads, seq_q=cfg.seq_q, num_parts=parts) if parts else None
        return jax_mla.mla_decode(q, c, t, s, causal=cfg.causal, schedule=sched)

    fn = jax.jit(step)
    for i in range(3):
        jax.block_until_ready(fn(q, cache, tables[i % 2], seq_lens))
    print("ran", name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
