"""benchmarks/tma_bandwidth.cu (the KV load path's ceiling, run on the GPU machine by
`device_run.sh tmabw`) still compiles for sm_90a against the shared producer headers and issues its
copies as TMA loads (UTMALDG in its SASS). Compile only; skipped without nvcc."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from script_loader import ROOT, load_script


def _cuobjdump():
    """cuobjdump on PATH, else from NVIDIA's pip wheel as .ci/check_sass.py finds it; None if neither."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        return load_script(".ci/check_sass.py").find_tool("cuobjdump")
    except (ImportError, SystemExit):  # no nvidia wheels, or none with cuobjdump
        return None


def test_tma_bandwidth_compiles_to_tma_loads(tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc on PATH")
    exe = tmp_path / "tma_bandwidth"
    cmd = [nvcc, "-std=c++17", "-O2", "-gencode", "arch=compute_90a,code=sm_90a", "-I", os.path.join(ROOT, "cuda"),
           os.path.join(ROOT, "benchmarks/tma_bandwidth.cu"), os.path.join(ROOT, "cuda/common/tensor_map.cu"),
           "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    cuobjdump = _cuobjdump()
    if cuobjdump is None:
        return  # compiled; the SASS check needs the cuobjdump wheel (CI installs it)
    sass = subprocess.run([cuobjdump, "-sass", str(exe)], capture_output=True, text=True).stdout
    assert "UTMALDG" in sass
    # The contention mode's Q K^T-like groups: 36 wgmma per stage count (1 and 2), not serialised.
    assert sass.count("HGMMA") >= 72
