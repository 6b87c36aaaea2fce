"""Checks the machine code of the built extension: every decode kernel must use the instructions it
was written for, so no path can silently fall back to something slower:
  - the SM90 kernel (sm_90a): HGMMA (wgmma) and UTMALDG (TMA loads);
  - the SM100 kernel (sm_100a, and sm_103a when the build has it, nvcc >= 12.9): a tcgen05 MMA
    (UTCHMMA, or any UTC*MMA form), TMEM loads (LDTM) and TMA loads (UTMALDG), and no local memory
    (LDL/STL: register spills or a stack array), which ptxas's report shows at build time only;
  - the portable kernel (sm_80, which runs on every 8.x GPU, sm_90 and sm_120): HMMA (mma.sync),
    LDSM (ldmatrix) and LDGSTS (cp.async), and no local-memory spills (LDL/STL); its compute_80 PTX
    (for GPUs without a cubin) must be embedded too.
Their FP8-cache instantiations (KvFormat::kFp8) must also carry the sparse decode's gather of
one-token pages (common/fp8_tile.cuh gather_fp8_tile: LDGSTS, cp.async).
The SM90 kernel's production instantiations must also carry the in-kernel split merge
(cuda/sm90/split_merge.cuh, used at run time where the grid fits): its release-add on the arrival
counter (REDG ... STRONG.GPU).
Every instantiation must be there: bf16 and fp16 of each kernel, each over both cache formats
(KvFormat::kFp8: 656-byte rows dequantized in shared memory); for SM90 and SM100 each also as the
production and the self-check's watchdog instantiation (decode_kernel<Element, false / true, format>,
common/watchdog.cuh). All get the same instruction checks. Uses cuobjdump and nvdisasm
from NVIDIA's pip wheels.

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


_SM100 = {"UTC*MMA": r"\bUTC\w*MMA\b", "LDTM": r"\bLDTM\b", "UTMALDG": r"\bUTMALDG\b"}
_PORTABLE = {"HMMA": r"\bHMMA\b", "LDSM": r"\bLDSM\b", "LDGSTS": r"\bLDGSTS\b"}
_SPILLS = {"LDL": r"\bLDL\b", "STL": r"\bSTL\b"}
# The release-add of the SM90 kernel's split merge.
_MERGE_ARRIVE = r"\bREDG\.E\.ADD\.S32\.STRONG\.GPU\b"
# (architecture, kernel namespace, decode kernels expected, required instruction patterns, forbidden ones,
#  required in the build?)
CHECKS = (
    # bf16, fp16 x production, watchdog x 16-bit cache, FP8 cache
    ("sm_90a", "sm90", 8, {"HGMMA": r"\bHGMMA\b", "UTMALDG": r"\bUTMALDG\b"}, {}, True),
    ("sm_100a", "sm100", 8, _SM100, _SPILLS, True),
    ("sm_103a", "sm100", 8, _SM100, _SPILLS, False),
    ("sm_80", "portable", 4, _PORTABLE, _SPILLS, True),  # bf16, fp16 x 16-bit cache, FP8 cache
    ("sm_90", "portable", 4, _PORTABLE, _SPILLS, True),
    ("sm_120", "portable", 4, _PORTABLE, _SPILLS, True),
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
    for arch, namespace, expected, required, forbidden, mandatory in CHECKS:
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
        tag = f"{len(namespace)}{namespace}"  # the Itanium-mangled namespace, e.g. 8portable
        matching = {n: t for n, t in funcs.items() if "decode_kernel" in n and tag in n}
        if len(matching) != expected:  # see CHECKS
            failures.append(f"{arch}: expected {expected} {namespace} decode kernels, found {sorted(matching)}")
        if namespace != "portable":
            # decode_kernel<Element, bool kWatchdog>: Lb0E production, Lb1E the self-check's.
            for flag in ("Lb0E", "Lb1E"):
                if sum(flag in n for n in matching) != expected // 2:
                    failures.append(f"{arch}: expected {expected // 2} {namespace} decode kernels with {flag}, "
                                    f"found {sorted(matching)}")
        for n, text in matching.items():
            counts = {i: len(re.findall(pattern, text)) for i, pattern in {**required, **forbidden}.items()}
            print(f"  {n[:70]}: " + ", ".join(f"{i} x{c}" for i, c in counts.items()))
            failures += [f"{arch}: {n} has no {i}" for i in required if counts[i] == 0]
            failures += [f"{arch}: {n} has {i} (local memory: register spills or a stack array)" for i in forbidden
                         if counts[i] > 0]
            if namespace != "portable" and "KvFormatE1" in n and not re.search(r"\bLDGSTS\b", text):
                failures.append(f"{arch}: {n} (FP8 cache) has no LDGSTS (the gather of one-token pages)")
            if namespace == "sm90" and "Lb0E" in n and not re.search(_MERGE_ARRIVE, text):
                failures.append(f"{arch}: {n} has no split-merge arrival (REDG ... STRONG.GPU)")
    res = subprocess.run([tool, "--list-ptx", so], capture_output=True, text=True)
    ptx = re.findall(r"PTX file\s+\d+:\s+(\S+)\.(sm_\d+)\.ptx", res.stdout)
    sources = ("decode_bf16", "decode_fp16", "decode_bf16_fp8", "decode_fp16_fp8")
    portable_ptx = sorted(f"{n}.{a}" for n, a in ptx if n in sources and a == "sm_80")
    print(f"compute_80 PTX of the portable kernel: {portable_ptx}")
    if portable_ptx != sorted(f"{n}.sm_80" for n in sources):
        failures.append(f"no compute_80 PTX of the portable kernel (cuobjdump --list-ptx: {res.stdout.strip()})")
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
