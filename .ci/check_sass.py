"""Checks the machine code of the built extension: the SM90 decode kernel must use the Hopper
instructions it was written for (HGMMA = wgmma, UTMALDG = TMA loads), so the fast path cannot
silently fall back to something slower. Uses cuobjdump and nvdisasm from NVIDIA's pip wheels.

  python3 -P .ci/check_sass.py      (inside an environment where jax_mla is installed)
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys


def find_tool(name: str) -> str:
    import nvidia  # namespace package of the nvidia-* wheels

    for root in nvidia.__path__:
        hits = glob.glob(os.path.join(root, "**", "bin", name), recursive=True)
        if hits:
            return hits[0]
    raise SystemExit(f"{name} not found: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm")


def kernels(sass: str) -> dict[str, str]:
    """Function name -> its SASS text."""
    out, name, lines = {}, None, []
    for line in sass.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            if name:
                out[name] = "\n".join(lines)
            name, lines = m.group(1), []
        elif name:
            lines.append(line)
    if name:
        out[name] = "\n".join(lines)
    return out


def main() -> int:
    from jax_mla import _ext

    so = _ext.__file__
    tool = find_tool("cuobjdump")
    # cuobjdump runs nvdisasm to print SASS.
    os.environ["PATH"] = os.path.dirname(find_tool("nvdisasm")) + os.pathsep + os.environ.get("PATH", "")
    failures = []
    for arch, required in (("sm_90a", {"decode_kernel": ["HGMMA", "UTMALDG"]}),):
        res = subprocess.run([tool, "--dump-sass", "--gpu-architecture", arch, so], capture_output=True, text=True)
        if res.returncode != 0:
            failures.append(f"cuobjdump {arch}: {res.stderr.strip()}")
            continue
        funcs = kernels(res.stdout)
        print(f"{arch}: {len(funcs)} kernels in {os.path.basename(so)}")
        for pattern, instrs in required.items():
            matching = {n: t for n, t in funcs.items() if pattern in n and "sm90" in n}
            if not matching:
                failures.append(f"{arch}: no kernel matching '{pattern}'")
            for n, text in matching.items():
                counts = {i: len(re.findall(r"\b" + i + r"\b", text)) for i in instrs}
                print(f"  {n[:70]}: " + ", ".join(f"{i} x{c}" for i, c in counts.items()))
                failures += [f"{arch}: {n} has no {i}" for i, c in counts.items() if c == 0]
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
