"""Sharded decode on several devices against one device: results, collectives, per-device throughput.

For issue #8 (two GPUs; runs as well on CPU devices forced with
XLA_FLAGS=--xla_force_host_platform_device_count=N, which is how CI exercises it):

    python3 benchmarks/bench_sharded.py [--devices N] [--only b128_sq1_h128_4k,...] [--repeats R] [--json OUT]

Per config (default: the facts file's large configs, b128/4K and b64/h16/8K):
- one device: bench_decode.py's step (calls back to back, each with its own block table over
  rotated page sets, one split plan per step) on jax.devices()[0];
- data parallel: N times the batch, each device holding its own requests, pages and page sets
  (jax.shard_map over a "data" axis; the block tables hold each shard's local page ids): the same
  work per device as the single-device run, so per-device throughput = t(one) / t(data parallel);
- tensor parallel: the same batch with its heads split over the devices, cache, block tables and
  lengths replicated (every device reads the whole KV): per-device throughput = t(one) / (N t(tp)).

Checks, printed and counted in the exit status: the data-parallel output equals, bit for bit, each
shard's problem run alone on one device (first and last shard: same problem, same split policy);
the tensor-parallel output agrees with the single-device run of the whole problem up to one
rounding of the output type (fewer heads per call plan other splits); the compiled steps contain the op and no
collective (all-gather, all-reduce, collective-permute, all-to-all, reduce-scatter, ...).
Timing is bench_decode.py's (warm-up, median over repeats of step time / calls; CUDA graphs on GPU).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "api"))

import bench_decode  # noqa: E402
from configs import Config, find  # noqa: E402
# The sharding checks' helpers: the collective names looked for in compiled HLO, and the agreement
# of one problem split two ways (tests/api/sharding_worker.py, which runs the same checks on N devices).
from sharding_worker import assert_agree, collectives  # noqa: E402,F401

DEFAULT_CONFIGS = "b128_sq1_h128_4k,b64_sq1_h16_8k"
# For CPU devices (the CI test): small enough for the C++ kernel, still several pages per request.
TINY = Config("tiny_b4_h16_300", 4, 1, 16, 300)


def f32(x):
    import numpy as np
    return np.asarray(x).astype(np.float32)


def agree(got, want, dtype) -> bool:
    """(out, lse) of the same problem split differently (heads over devices: other row blocks and
    split points): sharding_worker.assert_agree's rule (one rounding of the output type, fp32 noise
    in the LSE) as a yes or no."""
    import numpy as np
    try:
        assert_agree(got, want, np.dtype(dtype).name)
    except AssertionError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=0, help="devices to shard over (default: all)")
    ap.add_argument("--only", default=DEFAULT_CONFIGS,
                    help=f"comma-separated config names (default {DEFAULT_CONFIGS}; '{TINY.name}' for CPU)")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--calls", type=int, default=0, help="calls per step (default: as bench_decode.py)")
    ap.add_argument("--no-graphs", action="store_true", help="do not ask XLA for CUDA graphs")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    bench_decode._setup_xla_flags(not args.no_graphs)

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import PartitionSpec as P

    import jax_mla

    n = args.devices or jax.device_count()
    if n < 2 or n > jax.device_count():
        print(f"needs 2..{jax.device_count()} devices, asked for {n} (on CPU: XLA_FLAGS="
              "--xla_force_host_platform_device_count=N)", file=sys.stderr)
        return 2
    devices = jax.devices()[:n]
    mesh = jax.make_mesh((n,), ("data",), devices=devices,
                         axis_types=(jax.sharding.AxisType.Explicit,))
    one = jax.sharding.SingleDeviceSharding(devices[0])
    print(f"{n} x {devices[0].device_kind} ({devices[0].platform}); jax {jax.__version__}", flush=True)

    rows, failures = [], 0
    rng = np.random.default_rng(0)
    for name in [s for s in args.only.split(",") if s]:
        cfg = TINY if name == TINY.name else find(name)
        if cfg.heads % n:
            print(f"{cfg.name}: {cfg.heads} heads do not split over {n} devices", file=sys.stderr)
            return 2
        kv_bytes = float(cfg.seq_lens().sum()) * 576 * 2
        num_sets = max(2, min(16, math.ceil(4 * bench_decode.L2_BYTES / kv_bytes)))
        calls = args.calls or max(num_sets, cfg.calls_per_step(hi=64))
        print(f"[{cfg.name}] inputs: {n} shards x {num_sets} page sets, {calls} calls per step", flush=True)
        # One problem per shard, each as bench_decode builds it (own page sets, own tables).
        shards = [bench_decode.build_inputs(cfg, rng, jnp, np, num_sets, calls) for _ in range(n)]

        def step_body(heads):
            def step(q, cache, tables, seq_lens):
                sched = jax_mla.decode_schedule(seq_lens, num_heads=heads, seq_q=cfg.seq_q)
                acc = jnp.zeros((1,), jnp.float32)
                for i in range(calls):
                    out = jax_mla.mla_decode(q, cache, tables[i], seq_lens, causal=cfg.causal,
                                             schedule=sched)
                    acc = acc + out[0, 0, 0, i % 512].astype(jnp.float32)
                return acc
            return step

        def call_one(q, cache, table, seq_lens):
            return jax_mla.mla_decode(q, cache, table, seq_lens, causal=cfg.causal, return_lse=True)

        # One device: shard 0's problem.
        single = [jax.device_put(x, one) for x in shards[0]]
        step_one = jax.jit(step_body(cfg.heads))
        t_one = bench_decode.time_step(step_one, single, args.repeats, calls)

        # Data parallel: the shards' problems side by side, local page ids per shard.
        dp_in = (jnp.concatenate([s[0] for s in shards]), jnp.concatenate([s[1] for s in shards]),
                 jnp.concatenate([s[2] for s in shards], axis=1), jnp.concatenate([s[3] for s in shards]))
        dp_specs = (P("data"), P("data"), P(None, "data"), P("data"))
        dp_args = [jax.device_put(x, jax.sharding.NamedSharding(mesh, s)) for x, s in zip(dp_in, dp_specs)]
        step_dp = jax.jit(jax.shard_map(step_body(cfg.heads), mesh=mesh, in_specs=dp_specs,
                                        out_specs=P("data")))
        t_dp = bench_decode.time_step(step_dp, dp_args, args.repeats, calls)
        call_dp = jax.jit(jax.shard_map(call_one, mesh=mesh, in_specs=(P("data"),) * 4,
                                        out_specs=(P("data"), P("data"))))
        table0 = jax.device_put(dp_in[2][0], jax.sharding.NamedSharding(mesh, P("data")))
        got = [f32(x) for x in call_dp(dp_args[0], dp_args[1], table0, dp_args[3])]
        b = cfg.batch
        same_dp = True
        for k in sorted({0, n - 1}):
            want = jax.jit(call_one)(*[jax.device_put(x, one) for x in
                                      (shards[k][0], shards[k][1], shards[k][2][0], shards[k][3])])
            for g, w in zip(got, want):
                same_dp &= bool(np.array_equal(g[k * b:(k + 1) * b], f32(w), equal_nan=True))

        # Tensor parallel: shard 0's problem with its heads split; the rest replicated.
        tp_specs = (P(None, None, "data"), P(), P(), P())
        tp_args = [jax.device_put(x, jax.sharding.NamedSharding(mesh, s)) for x, s in zip(single, tp_specs)]
        step_tp = jax.jit(jax.shard_map(step_body(cfg.heads // n), mesh=mesh, in_specs=tp_specs,
                                        out_specs=P("data")))
        t_tp = bench_decode.time_step(step_tp, tp_args, args.repeats, calls)
        call_tp = jax.jit(jax.shard_map(call_one, mesh=mesh, in_specs=tp_specs,
                                        out_specs=(P(None, None, "data"), P(None, None, "data"))))
        got = call_tp(tp_args[0], tp_args[1], jax.device_put(single[2][0], jax.sharding.NamedSharding(mesh, P())),
                      tp_args[3])
        want = jax.jit(call_one)(single[0], single[1], single[2][0], single[3])
        same_tp = agree(got, want, np.dtype(single[0].dtype))

        hlo = {what: fn.lower(*a).compile().as_text()
               for what, fn, a in (("data parallel", step_dp, dp_args), ("tensor parallel", step_tp, tp_args))}
        found = {what: collectives(text) for what, text in hlo.items()}
        has_op = all("jax_mla_decode" in text for text in hlo.values())
        ok = same_dp and same_tp and has_op and not any(found.values())
        failures += not ok
        row = dict(name=cfg.name, devices=n, device_kind=devices[0].device_kind, calls=calls, sets=num_sets,
                   us_one=t_one, us_dp=t_dp, us_tp=t_tp, dp_per_device=t_one / t_dp,
                   tp_per_device=t_one / (n * t_tp), dp_bit_identical=same_dp, tp_agrees=same_tp,
                   collectives=found, op_in_hlo=has_op)
        rows.append(row)
        print(f"[{cfg.name}] one device {t_one:.1f} us, data parallel {t_dp:.1f} us "
              f"(per-device throughput {row['dp_per_device']:.2f}x), tensor parallel {t_tp:.1f} us "
              f"({row['tp_per_device']:.2f}x); same as one device: data (bits) {same_dp}, tensor (rounding) {same_tp}; "
              f"collectives {found}; {'ok' if ok else 'FAILED'}", flush=True)
        del shards, single, dp_in, dp_args, tp_args

    print(f"\n{'config':24s} {'devices':>7s} {'one (us)':>9s} {'DP (us)':>9s} {'DP per-dev':>10s} "
          f"{'TP (us)':>9s} {'TP per-dev':>10s} {'agrees':>7s} {'collectives':>11s}")
    for r in rows:
        coll = "none" if not any(r["collectives"].values()) else "FOUND"
        same = "yes" if r["dp_bit_identical"] and r["tp_agrees"] else "NO"
        print(f"{r['name']:24s} {r['devices']:7d} {r['us_one']:9.1f} {r['us_dp']:9.1f} {r['dp_per_device']:10.2f} "
              f"{r['us_tp']:9.1f} {r['tp_per_device']:10.2f} {same:>7s} {coll:>11s}")
    print("per-dev: per-device throughput over the one-device run's (#8's bar: >= 0.9 for data parallel); "
          "TP reads the whole KV on every device.")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "argv": sys.argv[1:]}, f, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
