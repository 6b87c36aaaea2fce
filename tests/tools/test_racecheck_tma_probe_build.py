"""benchmarks/racecheck_tma_probe.cu (the SM90 FP8 path's slot reuse alone, run under racecheck by
`device_run.sh raceprobe`) still compiles for sm_90a, and its modes 0 and 1 fill a slot with a bulk
copy that completes an mbarrier by its transaction bytes (UBLKCP in the SASS), the ordering whose
handling by the tool the probe tests. Compile only; skipped without nvcc."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from script_loader import ROOT, load_script


def test_racecheck_tma_probe_fills_slots_by_bulk_copy(tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc on PATH")
    exe = tmp_path / "racecheck_tma_probe"
    r = subprocess.run([nvcc, "-std=c++17", "-O2", "-gencode", "arch=compute_90a,code=sm_90a",
                        os.path.join(ROOT, "benchmarks/racecheck_tma_probe.cu"), "-o", str(exe)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    try:
        cuobjdump = shutil.which("cuobjdump") or load_script(".ci/check_sass.py").find_tool("cuobjdump")
    except (ImportError, SystemExit):  # no nvidia wheels, or none with cuobjdump
        return  # compiled; the SASS check needs the cuobjdump wheel (CI installs it)
    sass = subprocess.run([cuobjdump, "-sass", str(exe)], capture_output=True, text=True).stdout
    assert "UBLKCP" in sass and "SYNCS.PHASECHK.TRANS64.TRYWAIT" in sass
