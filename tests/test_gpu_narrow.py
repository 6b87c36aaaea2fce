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


# (JAX_MLA_SM90_NARROW, JAX_MLA_SM90_TRANSPOSED_ROWS): the three shapes for <= 16 rows, and the
# transposed kernel on every request in row blocks of 16 ("all": the worker then runs all of
# test_gpu.CASES, every row count, instead of the <= 16-row ones).
SHAPES = [("1", "16"), ("transposed", "16"), ("transposed_pipelined", "16"), ("transposed_splitk", "16"),
          ("transposed_pipelined", "all"), ("transposed_splitk", "all")]


@pytest.mark.parametrize("shape,rows", SHAPES, ids=[f"{s}-rows{r}" for s, r in SHAPES])
def test_narrow_shape_matches_reference(tmp_path, shape, rows):
    # 300 s, well under a device call's 600: a shape that deadlocks (the transposed one has never
    # run) fails this test instead of holding the whole call.
    env = dict(os.environ, JAX_MLA_SM90_NARROW=shape, JAX_MLA_SM90_TRANSPOSED_ROWS=rows)
    env.pop("JAX_MLA_KERNEL", None)
    proc = subprocess.run([sys.executable, "-P", os.path.join(TESTS, "gpu_narrow_worker.py")], cwd=str(tmp_path),
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
    assert " 0 failed" in proc.stdout
