"""benchmarks/racecheck_probe.cu (the SM90 epilogue's row-sum exchange alone, run under racecheck by
`device_run.sh raceprobe`) still compiles for sm_90a, and its mode 0 is the epilogue's barrier: a
BAR.SYNC on named barrier 3 for 256 threads in its SASS, as in the SM90 decode kernel. Compile only;
skipped without nvcc."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from script_loader import ROOT, load_script


def test_racecheck_probe_syncs_on_named_barrier_3(tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc on PATH")
    exe = tmp_path / "racecheck_probe"
    r = subprocess.run([nvcc, "-std=c++17", "-O2", "-gencode", "arch=compute_90a,code=sm_90a",
                        os.path.join(ROOT, "benchmarks/racecheck_probe.cu"), "-o", str(exe)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    try:
        cuobjdump = shutil.which("cuobjdump") or load_script(".ci/check_sass.py").find_tool("cuobjdump")
    except (ImportError, SystemExit):  # no nvidia wheels, or none with cuobjdump
        return  # compiled; the SASS check needs the cuobjdump wheel (CI installs it)
    sass = subprocess.run([cuobjdump, "-sass", str(exe)], capture_output=True, text=True).stdout
    assert "BAR.SYNC.DEFER_BLOCKING 0x3, 0x100" in sass
