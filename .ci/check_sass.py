"""Checks the machine code of the built extension: each decode kernel must use the instructions it
was written for, so the fast path cannot silently fall back to something slower:
  - sm_90a, the SM90 kernel: HGMMA (wgmma) and UTMALDG (TMA loads);
  - sm_100a and sm_103a, the SM100 kernel: a tcgen05 MMA (UTCHMMA, or any UTC*MMA form), TMEM loads
    (LDTM) and TMA loads (UTMALDG). sm_103a is checked when the build contains it (nvcc >= 12.9).
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


# (architecture, kernel namespace tag, required instruction patterns, required in the build?)
CHECKS = (
    ("sm_90a", "sm90", {"HGMMA": r"\bHGMMA\b", "UTMALDG": r"\bUTMALDG\b"}, True),
    ("sm_100a", "sm100", {"UTC*MMA": r"\bUTC\w*MMA\b", "LDTM": r"\bLDTM\b", "UTMALDG": r"\bUTMALDG\b"}, True),
    ("sm_103a", "sm100", {"UTC*MMA": r"\bUTC\w*MMA\b", "LDTM": r"\bLDTM\b", "UTMALDG": r"\bUTMALDG\b"}, False),
)


def archs_in(tool: str, so: str) -> set[str]:
    """Architectures with machine code in the binary (cuobjdump --list-elf)."""
    res = subprocess.run([tool, "--list-elf", so], capture_output=True, text=True)
    return set(re.findall(r"\bsm_\d+[af]?\b", res.stdout))


def main() -> int:
    from jax_mla import _ext

    so = _ext.__file__
    tool = find_tool("cuobjdump")
    # cuobjdump runs nvdisasm to print SASS.
    os.environ["PATH"] = os.path.dirname(find_tool("nvdisasm")) + os.pathsep + os.environ.get("PATH", "")
    failures = []
    present = archs_in(tool, so)
    for arch, tag, required, mandatory in CHECKS:
        if arch not in present:
            if mandatory:
                failures.append(f"{arch}: no machine code for it in {os.path.basename(so)}")
            else:
                print(f"{arch}: not in this build, skipped")
            continue
        res = subprocess.run([tool, "--dump-sass", "--gpu-architecture", arch, so], capture_output=True, text=True)
        if res.returncode != 0:
            failures.append(f"cuobjdump {arch}: {res.stderr.strip()}")
            continue
        funcs = kernels(res.stdout)
        print(f"{arch}: {len(funcs)} kernels in {os.path.basename(so)}")
        matching = {n: t for n, t in funcs.items() if "decode_kernel" in n and tag in n}
        if not matching:
            failures.append(f"{arch}: no {tag} decode_kernel")
        for n, text in matching.items():
            counts = {i: len(re.findall(pattern, text)) for i, pattern in required.items()}
            print(f"  {n[:70]}: " + ", ".join(f"{i} x{c}" for i, c in counts.items()))
            failures += [f"{arch}: {n} has no {i}" for i, c in counts.items() if c == 0]
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
