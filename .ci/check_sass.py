"""Checks the machine code of the built extension: every decode kernel must use the instructions it
was written for, so no path can silently fall back to something slower.
  - the SM90 kernel (sm_90a): HGMMA (wgmma) and UTMALDG (TMA loads);
  - the portable kernel (sm_80, which runs on every 8.x GPU, sm_90 and sm_120): HMMA (mma.sync),
    LDSM (ldmatrix) and LDGSTS (cp.async), and no local-memory spills (LDL/STL); its compute_80 PTX
    (for GPUs without a cubin) must be embedded too.
Uses cuobjdump and nvdisasm from NVIDIA's pip wheels.

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
    # (architecture, namespace of the kernel, instructions it must contain, instructions it must not)
    checks = [
        ("sm_90a", "sm90", ["HGMMA", "UTMALDG"], []),
        ("sm_80", "portable", ["HMMA", "LDSM", "LDGSTS"], ["LDL", "STL"]),
        ("sm_90", "portable", ["HMMA", "LDSM", "LDGSTS"], ["LDL", "STL"]),
        ("sm_120", "portable", ["HMMA", "LDSM", "LDGSTS"], ["LDL", "STL"]),
    ]
    for arch, namespace, required, forbidden in checks:
        res = subprocess.run([tool, "--dump-sass", "--gpu-architecture", arch, so], capture_output=True, text=True)
        if res.returncode != 0:
            failures.append(f"cuobjdump {arch}: {res.stderr.strip()}")
            continue
        funcs = kernels(res.stdout)
        print(f"{arch}: {len(funcs)} kernels in {os.path.basename(so)}")
        tag = f"{len(namespace)}{namespace}"  # the Itanium-mangled namespace, e.g. 8portable
        matching = {n: t for n, t in funcs.items() if "decode_kernel" in n and tag in n}
        if len(matching) != 2:  # bf16 and fp16
            failures.append(f"{arch}: expected the bf16 and fp16 {namespace} decode kernels, found {sorted(matching)}")
        for n, text in matching.items():
            counts = {i: len(re.findall(r"\b" + i + r"\b", text)) for i in required + forbidden}
            print(f"  {n[:70]}: " + ", ".join(f"{i} x{c}" for i, c in counts.items()))
            failures += [f"{arch}: {n} has no {i}" for i in required if counts[i] == 0]
            failures += [f"{arch}: {n} has {i} (register spills)" for i in forbidden if counts[i] > 0]
    res = subprocess.run([tool, "--list-ptx", so], capture_output=True, text=True)
    ptx = re.findall(r"PTX file\s+\d+:\s+(\S+)\.(sm_\d+)\.ptx", res.stdout)
    portable_ptx = sorted(f"{n}.{a}" for n, a in ptx if n in ("decode_bf16", "decode_fp16") and a == "sm_80")
    print(f"compute_80 PTX of the portable kernel: {portable_ptx}")
    if portable_ptx != ["decode_bf16.sm_80", "decode_fp16.sm_80"]:
        failures.append(f"no compute_80 PTX of the portable kernel (cuobjdump --list-ptx: {res.stdout.strip()})")
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
