"""benchmarks/gather_probe.cu (the sparse gather's ceiling, run on the GPU machine by
`device_run.sh gatherprobe`) still compiles for sm_90a against the shared gather and rewrite
(common/fp8_tile.cuh) and moves rows by cp.async (plain, with the .L2::256B hint, with L2 prefetches
ahead), by per-row bulk copies and through registers. Compile only; skipped without nvcc."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from script_loader import ROOT, load_script
from test_tma_bandwidth_build import _cuobjdump


def _env_with_nvdisasm():
    """The environment with nvdisasm on PATH (cuobjdump runs it to print SASS), from NVIDIA's pip
    wheel as .ci/check_sass.py finds it, when it is not there already."""
    env = dict(os.environ)
    if shutil.which("nvdisasm") is None:
        try:
            tool = load_script(".ci/check_sass.py").find_tool("nvdisasm")
        except (ImportError, SystemExit):
            return env
        env["PATH"] = os.path.dirname(tool) + os.pathsep + env.get("PATH", "")
    return env


def test_gather_probe_compiles_to_cp_async(tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc on PATH")
    exe = tmp_path / "gather_probe"
    cmd = [nvcc, "-std=c++17", "-O2", "--expt-relaxed-constexpr", "-gencode", "arch=compute_90a,code=sm_90a",
           "-I", os.path.join(ROOT, "cuda"), os.path.join(ROOT, "benchmarks/gather_probe.cu"), "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    cuobjdump = _cuobjdump()
    if cuobjdump is None:
        return  # compiled; the SASS check needs the cuobjdump wheel (CI installs it)
    sass = subprocess.run([cuobjdump, "-sass", str(exe)], capture_output=True, text=True,
                          env=_env_with_nvdisasm()).stdout
    if "Function" not in sass:
        return  # no nvdisasm to print SASS with
    assert "LDGSTS.E.BYPASS.128" in sass          # the shipped gather and the probe's copy
    assert "LDGSTS.E.BYPASS.LTC256B.128" in sass  # the .L2::256B variant
    assert "CCTL.E.PF2" in sass                   # prefetch.global.L2 ahead
    assert "LDGSTSBAR" in sass                    # cp.async.mbarrier.arrive
    assert "UBLKCP" in sass                       # transport 1: per-row bulk copies
    assert "LDG.E.NA.128.CONSTANT" in sass        # transport 2: ld.global.nc into registers
    assert "LDL" not in sass and "STL" not in sass  # the register transport's 8 tokens stay in registers
