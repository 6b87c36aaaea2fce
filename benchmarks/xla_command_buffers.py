"""Which jax_mla custom calls of a jitted step XLA put into command buffers (CUDA graphs), and why not.

  python3 benchmarks/xla_command_buffers.py DUMP_DIR [VLOG_LOG...]

DUMP_DIR: an `--xla_dump_to=DUMP_DIR --xla_dump_hlo_as_text` dump. For every
`*after_optimizations.txt` it prints how many jax_mla calls the module has, how many sit in a
`command_buffer*` computation (how older XLA versions formed command buffers, in the HLO) and how
many are wrapped in a `dynamic-slice-fusion` (an operand sliced out of a larger array at a known
offset, e.g. `tables[i]`: XLA fuses the slice into the call's addressing, and the call then runs as a
kDynamicSliceFusion thunk, which a command buffer takes only when DYNAMIC_SLICE_FUSION is among
--xla_gpu_enable_command_buffer).

VLOG_LOG: stderr of the same run with TF_CPP_VMODULE=command_buffer_conversion_pass=3. jax 0.11's
XLA forms command buffers from thunks after the HLO passes, so the HLO shows none; the log names the
thunks of every command buffer it creates ("Creating command buffer thunk with the following
thunks: ...") and the thunk kinds it left out ("... is not enabled by the user for type X").

Found with it (docs/performance.md, 2026-12-03): the benchmark's decode calls were
dynamic-slice fusions and its XLA_FLAGS enabled only FUSION,CUSTOM_CALL, so none was captured.
"""

from __future__ import annotations

import glob
import os
import re
import sys

_HEADER = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_TARGET = re.compile(r'custom_call_target="(jax_mla_[a-z_]+)"')
_CREATED = re.compile(r"Creating command buffer thunk with the following thunks: (.*)$")
_NOT_ENABLED = re.compile(r"Thunk kind (\w+) lowering is not enabled by the user for type (\w+)")
_DECODE_THUNK = re.compile(r"^mla_decode(\.\d+)?$")


def summarize(path: str) -> dict:
    """Counts of jax_mla custom calls in one optimized-HLO text file, per kind of enclosing computation."""
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
    in_dsf: dict[str, int] = {}
    for c, counts in per_comp.items():
        for target, n in counts.items():
            total[target] = total.get(target, 0) + n
            if c.startswith("command_buffer"):
                in_cb[target] = in_cb.get(target, 0) + n
            if c.startswith("dynamic-slice-fusion") or c.startswith("address-computation"):
                in_dsf[target] = in_dsf.get(target, 0) + n
    return dict(total=total, in_command_buffers=in_cb, in_dynamic_slice_fusions=in_dsf,
                command_buffer_computations=cb_comps)


def summarize_log(path: str) -> dict:
    """Command buffers created (thunks named in the conversion pass's VLOG) and thunk kinds left out."""
    buffers = 0
    decode_thunks = 0
    not_enabled: dict[str, int] = {}
    for line in open(path, errors="replace"):
        m = _CREATED.search(line)
        if m:
            buffers += 1
            decode_thunks += sum(bool(_DECODE_THUNK.match(t.strip())) for t in m.group(1).split(","))
            continue
        m = _NOT_ENABLED.search(line)
        if m:
            not_enabled[m.group(2)] = not_enabled.get(m.group(2), 0) + 1
    return dict(command_buffers=buffers, decode_thunks_in_command_buffers=decode_thunks,
                not_enabled=not_enabled)


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    files = sorted(glob.glob(os.path.join(sys.argv[1], "**", "*after_optimizations.txt"), recursive=True))
    if not files:
        print("no *after_optimizations.txt under", sys.argv[1])
    for f in files:
        s = summarize(f)
        if s["total"]:
            print(f"{os.path.basename(f)}: jax_mla calls {s['total']}, inside command-buffer computations "
                  f"{s['in_command_buffers'] or 0}, inside dynamic-slice fusions {s['in_dynamic_slice_fusions'] or 0}")
    for log in sys.argv[2:]:
        s = summarize_log(log)
        print(f"{os.path.basename(log)}: command buffers created {s['command_buffers']}, mla_decode thunks in them "
              f"{s['decode_thunks_in_command_buffers']}, thunks left out (type: count) {s['not_enabled'] or 0}")
    return 0 if files or sys.argv[2:] else 1


if __name__ == "__main__":
    sys.exit(main())
