"""The SM90 kernel's narrow shape for <= 16 query rows (cuda/sm90/config.h), which is off by default
(JAX_MLA_SM90_NARROW=1 turns it on; the CUDA handler reads the variable once per process): every
case of test_gpu.py with at most 16 rows, run in a subprocess with it on (tests/gpu_narrow_worker.py).
On GPUs other than SM90 the variable changes nothing and the worker checks the device's own kernel."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

TESTS = os.path.dirname(os.path.abspath(__file__))


def test_narrow_shape_matches_reference(tmp_path):
    env = dict(os.environ, JAX_MLA_SM90_NARROW="1")
    env.pop("JAX_MLA_KERNEL", None)
    proc = subprocess.run([sys.executable, "-P", os.path.join(TESTS, "gpu_narrow_worker.py")], cwd=str(tmp_path),
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
    assert " 0 failed" in proc.stdout
