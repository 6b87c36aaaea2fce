"""The SM90 split merge's other path: by default the decode kernel merges split requests itself
(cuda/sm90/split_merge.cuh) wherever its grid fits, so test_gpu.py covers that path; here
tests/test_gpu.py's SM90 cases (the sweep, the large cases, many splits, empty and negative lengths,
bit-identical repeats) run again with JAX_MLA_SM90_MERGE=combine (the combine kernel merges), in a
subprocess since the CUDA handler reads the variable once per process. test_gpu.py's last test
checks that the requested path really ran."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

TESTS = os.path.dirname(os.path.abspath(__file__))


def test_combine_merge_matches_reference(tmp_path):
    # 300 s, well under a device call's 600 (the whole file took 52 s on an H100).
    env = dict(os.environ, JAX_MLA_SM90_MERGE="combine", JAX_MLA_GPU_KERNELS="auto")
    env.pop("JAX_MLA_KERNEL", None)
    proc = subprocess.run([sys.executable, "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu",
                           os.path.join(TESTS, "test_gpu.py")], cwd=str(tmp_path), env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
    assert " passed" in proc.stdout and " failed" not in proc.stdout
