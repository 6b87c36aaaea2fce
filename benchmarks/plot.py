"""Plots a bench_peers.py result: time per call over the roofline floor, per config, for FlashMLA,
FlashAttention-3 and jax_mla (the floor from the ceilings measured in the same run).

Usage: python benchmarks/plot.py RESULT.json OUT.png
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from configs import CONFIGS  # noqa: E402

LABELS = {"flashmla": "FlashMLA", "fa3": "FlashAttention-3", "jax_mla": "jax_mla"}
COLORS = {"flashmla": "0.55", "fa3": "0.8", "jax_mla": "tab:blue"}


def main() -> int:
    src, dst = sys.argv[1], sys.argv[2]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    data = json.load(open(src))
    rows = {r["name"]: r for r in data["rows"]}
    cfgs = [c for c in CONFIGS if c.name in rows]
    x = np.arange(len(cfgs))
    width = 0.8 / len(LABELS)
    fig, ax = plt.subplots(figsize=(13, 5))
    for k, impl in enumerate(LABELS):
        ratio = [rows[c.name]["us"][impl] / c.floor_us(data["copy_gbps"], data["matmul_tflops"]) for c in cfgs]
        ax.bar(x + (k - (len(LABELS) - 1) / 2) * width, ratio, width, label=LABELS[impl], color=COLORS[impl])
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--", label="roofline floor")
    ax.set_xticks(x, [c.name.replace("_", "\n", 2) for c in cfgs], fontsize=8)
    ax.set_ylabel("time per call / roofline floor (lower is better)")
    ax.set_title(f"MLA decode, bf16, page 64, on {data['device_kind']} "
                 f"(floor: {data['copy_gbps']:.0f} GB/s copy, {data['matmul_tflops']:.0f} TFLOP/s bf16, measured)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    print("wrote", dst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
