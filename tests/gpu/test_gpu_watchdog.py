"""The self-check's watchdog on a real GPU (marker gpu): the SM90 kernel on an H100 / H200 shares the
KV producer and the barrier-wait policy (cuda/common/kv_producer.cuh, watchdog.cuh) with the SM100
kernel, which no GPU here can run. A fault mode withholds one barrier arrival of the producer; without
the watchdog the kernel would wait forever (and initialization with it). These tests prove that:
  - the watchdog ends the kernel within its budget, without a trap: the check fails with a watchdog
    message and the CUDA context stays usable (the same check then passes, decodes with every
    kernel are right);
  - with JAX_MLA_SELFCHECK=hang, initialization falls back to the portable kernel with one warning;
  - the whole self-check (every case, both dtypes, both cache formats, both kernels) takes a few ms
    of GPU time.
Each runs in a fresh process (tests/gpu/gpu_watchdog_worker.py, gpu_dispatch_worker.py).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import jax
import numpy as np
import pytest

import cases
import jax_mla

pytestmark = pytest.mark.gpu

TESTS = os.path.dirname(os.path.abspath(__file__))
ENV_VARS = ("JAX_MLA_KERNEL", "JAX_MLA_SELFCHECK")


def needs_sm90():
    if jax_mla.kernel_info(jax.devices("gpu")[0])["compute_capability"] != (9, 0):
        pytest.skip("needs a compute capability 9.0 GPU (H100 / H200)")


def run(tmp_path, worker, env_update, *args):
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS and k != "JAX_PLATFORMS"}
    env.update(env_update)
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    out = tmp_path / "result.pkl"
    proc = subprocess.run([sys.executable, "-P", os.path.join(TESTS, worker), str(out), *args], cwd=str(tmp_path),
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"worker exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-6000:]}"
    with open(out, "rb") as f:
        return pickle.load(f), proc.stderr


def assert_matches_reference(result, ref):
    assert not isinstance(result, str), result
    cases.assert_close_rel_l2(*result, *ref, out_tol=1e-2, lse_tol=1e-3)


@pytest.mark.parametrize("watchdog_ms", [50, 400])
def test_withheld_arrival_fails_the_check_within_its_budget(tmp_path, watchdog_ms):
    needs_sm90()
    res, _ = run(tmp_path, "gpu_watchdog_worker.py", {}, "sm90", str(watchdog_ms))
    hang = res["hang"]
    assert isinstance(hang, dict), hang
    assert not hang["passed"] and hang["watchdog_expired"], hang
    assert hang["detail"].startswith("bfloat16, case 'pieces': the watchdog expired: a barrier wait of the sm90 "
                                     f"kernel did not complete within {watchdog_ms} ms"), hang["detail"]
    assert hang["cases"] == 0
    # The first candidate launch expired after its budget: the whole check took about one budget (plus
    # the expired CTAs' 1 ms settle and the host's work), never much more.
    assert watchdog_ms / 1000 <= hang["seconds"] < watchdog_ms / 1000 + 1.0, hang
    # The same context: the check passes, and every kernel decodes correctly.
    force = res["force"]
    assert isinstance(force, dict) and force["passed"], force
    # x 2 dtypes: 6 cases over the 16-bit cache and, for a kernel that reads it, 7 over the FP8 cache
    # (the 6 and the gathered one-token pages).
    fp8_cases = 7 if "sm90" in jax_mla._validate.FP8_KERNELS else 0
    assert force["cases"] == 2 * (6 + fp8_cases) and not force["watchdog_expired"], force
    for k in ("auto", "sm90", "portable"):
        assert_matches_reference(res["results"][k], res["ref"])
    assert res["info"]["kernel"] == "sm90" and res["info"]["self_check"] == "not run", res["info"]


def test_whole_check_is_a_few_ms_of_gpu_time(tmp_path):
    needs_sm90()
    res, _ = run(tmp_path, "gpu_watchdog_worker.py", {}, "sm90", "500")
    force = res["force"]
    assert isinstance(force, dict) and force["passed"], force
    assert force["device_ms"] < 50, force


def test_hang_mode_falls_back_to_portable_with_one_warning(tmp_path):
    needs_sm90()
    res, stderr = run(tmp_path, "gpu_dispatch_worker.py", {"JAX_MLA_SELFCHECK": "hang"}, "auto", "portable", "sm90")
    info = res["info"]
    assert info["self_check"] == "failed" and info["fell_back"] and info["kernel"] == "portable", info
    assert "the watchdog expired" in info["self_check_detail"], info
    lines = [ln for ln in stderr.splitlines() if ln.startswith("jax_mla: WARNING")]
    assert len(lines) == 1 and "bfloat16, case 'pieces': the watchdog expired" in lines[0], stderr
    for k in ("auto", "portable", "sm90"):
        assert_matches_reference(res["results"][k], res["ref"])
    for x, y in zip(res["results"]["auto"], res["results"]["portable"]):  # auto ran the portable kernel
        np.testing.assert_array_equal(x.view(np.uint8), y.view(np.uint8))
