"""Which custom calls of a dumped XLA module ended up inside a command buffer (CUDA graph).

  python3 benchmarks/xla_command_buffers.py DUMP_DIR

Reads every `*after_optimizations.txt` of an `--xla_dump_to=DUMP_DIR --xla_dump_hlo_as_text` dump
and prints, per module, how many jax_mla custom calls it has and how many of them sit in a
computation that XLA's command-buffer scheduling created (named `command_buffer*`). The benchmark
(benchmarks/bench_decode.py) has never had its decode calls traced into a CUDA graph, while the
CUDA-graph test's smaller step has: a dump of both, read with this, shows where they differ.
"""

from __future__ import annotations

import glob
import os
import re
import sys

_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_TARGET = re.compile(r'custom_call_target="(jax_mla_[a-z_]+)"')


def summarize(path: str) -> dict:
    per_comp: dict[str, dict[str, int]] = {}
    comp = "?"
    cb_comps = 0
    for line in open(path, errors="replace"):
        if line and not line[0].isspace():
            m = _HEADER.match(line)
            if m:
                comp = m.group(1)
                cb_comps += comp.startswith("command_buffer")
            continue
        t = _TARGET.search(line)
        if t:
            per_comp.setdefault(comp, {}).setdefault(t.group(1), 0)
            per_comp[comp][t.group(1)] += 1
    total: dict[str, int] = {}
    in_cb: dict[str, int] = {}
    for c, counts in per_comp.items():
        for target, n in counts.items():
            total[target] = total.get(target, 0) + n
            if c.startswith("command_buffer"):
                in_cb[target] = in_cb.get(target, 0) + n
    return dict(total=total, in_command_buffers=in_cb, command_buffer_computations=cb_comps)


def main() -> int:
    files = sorted(glob.glob(os.path.join(sys.argv[1], "**", "*after_optimizations.txt"), recursive=True))
    if not files:
        print("no *after_optimizations.txt under", sys.argv[1])
        return 1
    for f in files:
        s = summarize(f)
        if s["total"]:
            print(f"{os.path.basename(f)}: jax_mla calls {s['total']}, inside command buffers "
                  f"{s['in_command_buffers'] or 0}, command-buffer computations {s['command_buffer_computations']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
