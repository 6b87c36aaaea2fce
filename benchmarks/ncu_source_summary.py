"""Summarises ncu's per-SASS-instruction warp-state samples (benchmarks/device_run.sh ncusrc).

  python3 benchmarks/ncu_source_summary.py src-1.csv [--top 40]

Input: `ncu -i report --page source --csv --print-source sass`. Prints the instructions with the
most stall samples (address, samples, share, SASS) and the samples summed per opcode, which is
usually enough to tell waiting-for-data (mbarrier try-wait loops), waiting-for-the-tensor-cores
(WARPGROUP.DEPBAR / wgmma waits), barrier waits (BAR.SYNC) and issue-bound arithmetic apart.
"""

from __future__ import annotations

import argparse
import collections
import csv
import io
import sys


def load(path: str):
    text = open(path, encoding="utf-8", errors="replace").read()
    start = text.find('"Address"')  # skip ncu's preamble lines
    if start < 0:
        start = text.find("Address")
    rows = list(csv.reader(io.StringIO(text[start:])))
    return rows[0], rows[1:]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    head, rows = load(args.csv)
    col = {h: i for i, h in enumerate(head)}
    sample_cols = [h for h in head if "Sampling" in h and "All" in h] or [h for h in head if "Sampling" in h]
    if not sample_cols:
        print("no warp-state sampling column; columns are:", head)
        return 1
    sc = col[sample_cols[0]]
    src = col.get("Source", 1)
    items = []
    for r in rows:
        if len(r) <= max(sc, src):
            continue
        try:
            n = float(r[sc] or 0)
        except ValueError:
            continue
        items.append((n, r[col.get("Address", 0)], r[src].strip()))
    total = sum(n for n, _, _ in items) or 1.0
    print(f"{len(items)} instructions, {total:.0f} samples ({sample_cols[0]})")
    for n, addr, sass in sorted(items, reverse=True)[: args.top]:
        print(f"{addr:>8} {n:8.0f} {100 * n / total:5.1f}%  {sass[:90]}")
    by_op = collections.Counter()
    for n, _, sass in items:
        op = sass.split()[0] if sass else "?"
        if op.startswith("@"):
            op = sass.split()[1] if len(sass.split()) > 1 else op
        by_op[op.split(".")[0]] += n
    print("\nper opcode:")
    for op, n in by_op.most_common(20):
        print(f"  {op:<14} {n:8.0f} {100 * n / total:5.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
