"""Plots measured versions against FlashMLA and the roofline floor: one PNG for docs/.

  python3 benchmarks/plot.py benchmarks/results/2026-12-02_h200.json docs/perf_h200.png

Each configuration gets a group of bars: time relative to the roofline floor (max of bytes / copy
bandwidth and FLOPs / matmul rate, with the facts file's ceilings), so 1.0 is the hardware limit,
for FlashMLA (facts file, graph replay) and every recorded version of ours.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from configs import CONFIGS, COPY_GBPS, MATMUL_TFLOPS  # noqa: E402


def floor_us(cfg) -> float:
    return max(cfg.bytes() / (COPY_GBPS * 1e3), cfg.flops() / (MATMUL_TFLOPS * 1e6))


def main() -> int:
    src, dst = sys.argv[1], sys.argv[2]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    data = json.load(open(src))
    series = {"FlashMLA (facts file)": {c.name: c.best_graph_us for c in CONFIGS}}
    for name, v in data["versions"].items():
        if name == "plain_xla":
            continue
        series[f"jax-mla {name} ({v['commit']})"] = v["us"]
    names = [c.name for c in CONFIGS]
    x = np.arange(len(names))
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(12, 5))
    for k, (label, us) in enumerate(series.items()):
        ratio = [us[c.name] / floor_us(c) if c.name in us else np.nan for c in CONFIGS]
        # tab20 has room for every version; the default cycle repeats after ten series.
        ax.bar(x + (k - (len(series) - 1) / 2) * width, ratio, width, label=label,
               color="black" if k == 0 else plt.cm.tab20(k % 20))
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--", label="roofline floor")
    ax.set_xticks(x, [n.replace("_", "\n", 2) for n in names], fontsize=8)
    ax.set_ylabel("time / roofline floor (lower is better)")
    ax.set_title(f"MLA decode on {data['gpu'].split(',')[0]}, {data['date']} "
                 f"(floor: {COPY_GBPS:.0f} GB/s copy, {MATMUL_TFLOPS:.0f} TFLOP/s bf16)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    print("wrote", dst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
