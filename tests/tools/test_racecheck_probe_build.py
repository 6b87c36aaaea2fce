"""The racecheck probes run by `device_run.sh raceprobe` still compile for sm_90a and contain the
synchronisation each one tests:
  - benchmarks/racecheck_probe.cu (the SM90 epilogue's row-sum exchange alone): its mode 0 is the
    epilogue's barrier, a BAR.SYNC on named barrier 3 for 256 threads, as in the SM90 decode kernel;
    its mode 3 the mainloop's P hand-off (BAR.ARV by the owner, BAR.SYNC on barrier 1 + owner);
  - benchmarks/racecheck_tma_probe.cu (the SM90 FP8 path's slot reuse alone): its modes 0 and 1 fill
    a slot with a bulk copy that completes an mbarrier by its transaction bytes (UBLKCP), waited on
    with a parity try-wait.
Compile only; skipped without nvcc. The SASS checks need cuobjdump (CI installs its wheel)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from script_loader import ROOT, load_script


def _probe_sass(tmp_path, name: str):
    """Compiles benchmarks/NAME.cu for sm_90a (asserting success); its SASS, or None without cuobjdump."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc on PATH")
    exe = tmp_path / name
    r = subprocess.run([nvcc, "-std=c++17", "-O2", "-gencode", "arch=compute_90a,code=sm_90a",
                        os.path.join(ROOT, f"benchmarks/{name}.cu"), "-o", str(exe)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    try:
        cuobjdump = shutil.which("cuobjdump") or load_script(".ci/check_sass.py").find_tool("cuobjdump")
    except (ImportError, SystemExit):  # no nvidia wheels, or none with cuobjdump
        return None  # compiled; the SASS check needs the cuobjdump wheel (CI installs it)
    return subprocess.run([cuobjdump, "-sass", str(exe)], capture_output=True, text=True).stdout


def test_racecheck_probe_syncs_on_named_barrier_3(tmp_path):
    sass = _probe_sass(tmp_path, "racecheck_probe")
    if sass is not None:
        assert "BAR.SYNC.DEFER_BLOCKING 0x3, 0x100" in sass
        # mode 3, the mainloop's P hand-off: arrive on 1 + owner, the other consumer syncs on it
        assert "BAR.ARV" in sass and "BAR.SYNC.DEFER_BLOCKING 0x1, 0x100" in sass


def test_racecheck_tma_probe_fills_slots_by_bulk_copy(tmp_path):
    sass = _probe_sass(tmp_path, "racecheck_tma_probe")
    if sass is not None:
        assert "UBLKCP" in sass and "SYNCS.PHASECHK.TRANS64.TRYWAIT" in sass
