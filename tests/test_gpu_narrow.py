"""The SM90 kernel's shapes for <= 16 query rows (cuda/sm90/config.h), which are off by default: the
narrow shape (JAX_MLA_SM90_NARROW=1) and the transposed shape (JAX_MLA_SM90_NARROW=transposed,
transposed_pipelined and transposed_splitk; the CUDA handler reads the variable once per process):
every case of test_gpu.py with at most 16 rows,
run in a subprocess with the shape on (tests/gpu_narrow_worker.py). On GPUs other than SM90 the
variable changes nothing and the worker checks the device's own kernel."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

TESTS = os.path.dirname(os.path.abspath(__file__))


# JAX_MLA_SM90_NARROW: the narrow shape and the transposed kernel's three variants.
SHAPES = ["1", "transposed", "transposed_pipelined", "transposed_splitk"]


@pytest.mark.parametrize("shape", SHAPES)
def test_narrow_shape_matches_reference(tmp_path, shape):
    # 300 s, well under a device call's 600: a shape that deadlocks fails this test instead of
    # holding the whole call.
    env = dict(os.environ, JAX_MLA_SM90_NARROW=shape)
    env.pop("JAX_MLA_KERNEL", None)
    proc = subprocess.run([sys.executable, "-P", os.path.join(TESTS, "gpu_narrow_worker.py")], cwd=str(tmp_path),
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
    assert " 0 failed" in proc.stdout
