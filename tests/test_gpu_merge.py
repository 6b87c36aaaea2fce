"""The SM90 split merge's forced modes. By default (JAX_MLA_SM90_MERGE=auto) the decode kernel merges
split requests itself (cuda/sm90/split_merge.cuh) wherever its grid fits, and the combine kernel
merges the others, so test_gpu.py covers the combine kernel on few of its cases. Here
tests/test_gpu.py's SM90 cases (the sweep, the large cases, many splits, empty and negative lengths,
bit-identical repeats) run again with combine (always the combine kernel) and with fused (the
decode kernel wherever its grid fits, one row block included), each in a subprocess since the CUDA
handler reads the variable once per process. test_gpu.py's test_requested_sm90_merge_ran checks
that the requested path really ran. While auto means fused (since the eighteenth session; that test
asserts it), the fused run repeats test_gpu.py's own default run and is skipped unless
JAX_MLA_SM90_MERGE sets another mode for that run."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

TESTS = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize("mode", ["combine", "fused"])
def test_forced_merge_matches_reference(tmp_path, mode):
    if mode == "fused" and (os.environ.get("JAX_MLA_SM90_MERGE") or "auto") in ("auto", "fused"):
        pytest.skip("auto is fused: test_gpu.py's default run already ran these cases fused "
                    "(test_requested_sm90_merge_ran checks it)")
    # 300 s, well under a device call's 600 (the whole file took 52 s on an H100 in the sixteenth
    # session, 77 s in the seventeenth with the schedule test's three policies). A fused merge
    # that deadlocks traps after 10 s per call (split_merge.cuh kMergeTimeoutNs).
    env = dict(os.environ, JAX_MLA_SM90_MERGE=mode, JAX_MLA_GPU_KERNELS="auto")
    env.pop("JAX_MLA_KERNEL", None)
    # The device scheduler's equality with the host plan does not depend on the merge (and is a
    # quarter of the file's time since it covers every split-plan policy): run once, by test_gpu.py.
    proc = subprocess.run([sys.executable, "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu",
                           "-k", "not device_schedule_equals_host_plan", os.path.join(TESTS, "test_gpu.py")],
                          cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-6000:]}\n{proc.stderr[-6000:]}"
    assert " passed" in proc.stdout and " failed" not in proc.stdout
