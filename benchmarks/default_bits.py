"""Bits of the default split-KV plans, to show that a change left them alone: run it once per build
(each with its own jax_mla on PYTHONPATH), then compare the two files.

    PYTHONPATH=/tmp/site-base python3 -P benchmarks/default_bits.py save base.npz [--kernel sm90]
    PYTHONPATH=/tmp/site      python3 -P benchmarks/default_bits.py save new.npz  [--kernel sm90]
    python3 benchmarks/default_bits.py compare base.npz new.npz

`save` runs mla_decode (batch_invariant left at its default) on the default device over the edge
cases and two random sweeps of tests/cases.py, each with the op's own schedule and with
decode_schedule's for 3 and 66 parts, and stores every out / lse bit pattern and every schedule.
`compare` lists the arrays whose bits differ (none: the default path is unchanged).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))


def save(path: str, kernel: str) -> None:
    import jax

    import cases
    import jax_mla

    gpu = jax.default_backend() == "gpu"
    pages = (16, 64, 128) if gpu else (1, 16, 64, 128)
    all_cases = (cases.edge_cases(pages) + cases.random_sweep(40, master_seed=2, page_sizes=pages)
                 + cases.random_sweep(20, master_seed=5, page_sizes=(64,), max_b=40, long_len=9000,
                                      budget=6_000_000))
    res = {}
    for i, c in enumerate(all_cases):
        d = cases.make(c)
        for parts in (None, 3, 66):
            kw = dict(softmax_scale=c.softmax_scale, causal=c.causal, return_lse=True)
            if gpu:
                kw["kernel"] = kernel
            if parts:
                kw["schedule"] = jax_mla.decode_schedule(d.seq_lens, num_heads=c.h_q, seq_q=c.s_q, num_parts=parts)
                res[f"schedule{i}_p{parts}"] = np.asarray(kw["schedule"])
            out, lse = jax_mla.mla_decode(*d.args, **kw)
            res[f"out{i}_p{parts}"] = np.asarray(out).view(np.uint16)
            res[f"lse{i}_p{parts}"] = np.asarray(lse).view(np.uint32)
    np.savez(path, **res)
    print(f"{len(res)} arrays from {len(all_cases)} cases ({jax.default_backend()}, {jax_mla.__file__})")


def compare(a_path: str, b_path: str) -> int:
    a, b = np.load(a_path), np.load(b_path)
    if set(a.files) != set(b.files):
        print("different array sets:", sorted(set(a.files) ^ set(b.files))[:10])
        return 1
    bad = [k for k in a.files if not np.array_equal(a[k], b[k])]
    print(f"{len(a.files)} arrays, {len(bad)} differ{': ' + ', '.join(bad[:20]) if bad else ''}")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("save")
    s.add_argument("path")
    s.add_argument("--kernel", default="auto", choices=["auto", "sm90", "sm100", "portable"])
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    args = ap.parse_args()
    if args.cmd == "save":
        save(args.path, args.kernel)
        return 0
    return compare(args.a, args.b)


if __name__ == "__main__":
    sys.exit(main())
