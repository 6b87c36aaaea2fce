"""jax_mla's benchmark rows against FlashMLA timed on the same GPU, per config.

    python3 benchmarks/compare_baseline.py --ours bench.json [bench-2.json ...] \
        --baseline flashmla.json [flashmla-2.json ...]

--ours: JSON files written by bench_decode.py --json (rows with name, impl, us). Only rows of the
default implementation are used: impl "jax_mla", or "jax_mla/<variant>" when --variant names it.
--baseline: JSON files written by the FlashMLA driver (benchmarks/flashmla_baseline/driver.cu):
"gpu" and "configs", each with name, us_per_call_with_metadata (its split-KV metadata kernel once
per step of back-to-back calls, as our benchmark plans its schedule once per step) and
us_per_call_without_metadata (metadata computed once before the timed graph, as FlashMLA's own
benchmark times it).

Prints, per config: each run's time in file order (the spread between processes is the noise any
ratio carries: 5-16% on the device machine), the median over runs of each, and median(ours) /
median(FlashMLA) against both FlashMLA numbers: "ratio" with its metadata kernel per step (like for
like), "ratio w/o" against its time without it (FlashMLA's own convention, the stricter bar for us).
Exits 1 when the files disagree on the GPU, a file has no rows, or no config is in both.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys


def _load(paths: list[str], what: str) -> list[dict]:
    docs = []
    for p in paths:
        with open(p) as f:
            d = json.load(f)
        if "configs" in d:  # the FlashMLA driver's file: its rows in our benchmark's terms
            d["device_kind"] = d.get("gpu", "?")
            d["rows"] = [{"name": c["name"], "us": c["us_per_call_with_metadata"],
                          "us_no_metadata": c["us_per_call_without_metadata"], "check": c.get("check")}
                         for c in d["configs"]]
        if not d.get("rows"):
            raise SystemExit(f"{p}: no rows ({what})")
        d["_path"] = p
        docs.append(d)
    return docs


def _device(d: dict) -> str:
    return str(d.get("device_kind") or d.get("device") or "?")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ours", nargs="+", required=True)
    ap.add_argument("--baseline", nargs="+", required=True)
    ap.add_argument("--variant", default="",
                    help="our implementation's variant tag (impl 'jax_mla/<variant>'), e.g. lazy")
    args = ap.parse_args(argv)
    ours = _load(args.ours, "jax_mla benchmark")
    base = _load(args.baseline, "FlashMLA driver")
    devices = {_device(d) for d in ours + base}
    if len(devices) != 1:
        print(f"the files come from different GPUs: {sorted(devices)}", file=sys.stderr)
        return 1
    impl = "jax_mla" + (f"/{args.variant}" if args.variant else "")

    our_us: dict[str, list[float]] = {}
    for d in ours:
        for r in d["rows"]:
            if r.get("impl") == impl:
                our_us.setdefault(r["name"], []).append(float(r["us"]))
    base_us: dict[str, list[float]] = {}
    base_nm: dict[str, list[float]] = {}
    for d in base:
        for r in d["rows"]:
            base_us.setdefault(r["name"], []).append(float(r["us"]))
            if "us_no_metadata" in r:
                base_nm.setdefault(r["name"], []).append(float(r["us_no_metadata"]))
    names = [n for n in base_us if n in our_us]
    if not names:
        print(f"no config has both a '{impl}' row and a FlashMLA row", file=sys.stderr)
        return 1

    print(f"GPU: {devices.pop()}; ours: {len(ours)} run(s) of '{impl}', FlashMLA: {len(base)} run(s)")
    print(f"{'config':26s} {'jax_mla runs (us)':>22s} {'FlashMLA runs (us)':>22s} "
          f"{'median ours':>11s} {'median FlashMLA':>15s} {'ratio':>6s} {'FlashMLA w/o meta':>17s} {'ratio w/o':>9s}")
    for n in names:
        o, b = our_us[n], base_us[n]
        mo, mb = statistics.median(o), statistics.median(b)
        if base_nm.get(n):
            mn = statistics.median(base_nm[n])
            nm, rn = f"{mn:.1f}", f"{mo / mn:.2f}"
        else:
            nm = rn = "-"
        print(f"{n:26s} {' '.join(f'{x:.1f}' for x in o):>22s} {' '.join(f'{x:.1f}' for x in b):>22s} "
              f"{mo:11.1f} {mb:15.1f} {mo / mb:6.2f} {nm:>17s} {rn:>9s}")
    print("ratio = median(jax_mla) / median(FlashMLA) on this GPU, < 1 is faster; both plan their split once per "
          "step of back-to-back calls. ratio w/o: against FlashMLA without its metadata kernel.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
