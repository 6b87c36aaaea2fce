"""SM90 split parts (JAX_MLA_SM90_SPLIT=2, 4, 8; the CUDA handler reads the variable once per
process): every case of test_gpu.py and its larger cases, at the default part count and at one
wave of clusters, in a subprocess (tests/gpu_split_worker.py). On GPUs other than SM90 the variable
changes nothing and the worker checks the device's own kernel."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

TESTS = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize("split", ["2", "4", "8"])
def test_split_parts_match_reference(tmp_path, split):
    # 300 s, well under a device call's 600: a protocol that deadlocks fails this test instead of
    # holding the whole call.
    env = dict(os.environ, JAX_MLA_SM90_SPLIT=split)
    env.pop("JAX_MLA_KERNEL", None)
    proc = subprocess.run([sys.executable, "-P", os.path.join(TESTS, "gpu_split_worker.py")], cwd=str(tmp_path),
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
    assert " 0 failed" in proc.stdout
