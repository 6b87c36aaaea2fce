"""Kernel dispatch on a real GPU (marker gpu): what kernel="auto" picks, explicit requests the device
cannot run, JAX_MLA_KERNEL, and the self-check with its fallback. The self-check and the environment
are per process, so those tests run tests/gpu/gpu_dispatch_worker.py in fresh processes.

Written for the H200 (compute capability 9.0), where JAX_MLA_SELFCHECK=force runs the SM90
kernel's self-check (as auto does for SM100 on 10.x) and JAX_MLA_SELFCHECK=fault makes it fail.
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


def gpu():
    return jax.devices("gpu")[0]


def compute_capability():
    return jax_mla.kernel_info(gpu())["compute_capability"]


def needs_sm90():
    if compute_capability() != (9, 0):
        pytest.skip("needs a compute capability 9.0 GPU (H100 / H200)")


def clean_env():
    if any(os.environ.get(v) for v in ENV_VARS):
        pytest.skip(f"{'/'.join(ENV_VARS)} set in this process")


def run_worker(tmp_path, env_update, *args):
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS and k != "JAX_PLATFORMS"}
    env.update(env_update)
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    out = tmp_path / "result.pkl"
    proc = subprocess.run([sys.executable, "-P", os.path.join(TESTS, "gpu_dispatch_worker.py"), str(out), *args],
                          cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"worker exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-6000:]}"
    with open(out, "rb") as f:
        return pickle.load(f), proc.stderr


def warnings(stderr):
    return [ln for ln in stderr.splitlines() if ln.startswith("jax_mla: WARNING")]


def assert_matches_reference(result, ref):
    assert not isinstance(result, str), result
    cases.assert_close_rel_l2(*result, *ref, out_tol=1e-2, lse_tol=1e-3)


def assert_bit_equal(a, b):
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.view(np.uint8), y.view(np.uint8))


def test_kernel_info_reports_the_device():
    clean_env()
    info = jax_mla.kernel_info(gpu())
    assert info["platform"] == "cuda" and "portable" in info["built"]
    cc = info["compute_capability"]
    if cc == (9, 0) and "sm90" in info["built"]:
        assert info["kernel"] == "sm90" and info["self_check"] == "not run"
    elif cc in ((10, 0), (10, 3)) and "sm100" in info["built"]:
        assert info["self_check"] in ("passed", "failed") and info["self_check_kernel"] == "sm100"
        assert info["kernel"] == ("sm100" if info["self_check"] == "passed" else "portable")
    else:
        assert info["kernel"] == "portable" and info["self_check"] == "not run"
    assert info["fell_back"] == (info["self_check"] == "failed")


def test_forced_portable_is_not_the_sm90_kernel():
    """kernel="portable" really runs another kernel on an H200: both match the reference but differ
    in the last bits somewhere (different summation orders), which a silent fallback would not."""
    needs_sm90()
    clean_env()
    data = cases.make(cases.Case(lens=(2000, 300), s_q=2, h_q=64, causal=True, seed=9402))
    args = [jax.device_put(x, gpu()) for x in data.args]
    res = {}
    for kernel in ("auto", "sm90", "portable"):
        out, lse = jax_mla.mla_decode(*args, causal=True, return_lse=True, kernel=kernel)
        res[kernel] = (np.asarray(out), np.asarray(lse))
    with jax.default_device(jax.devices("cpu")[0]):
        ref = cases.reference(data)
    for r in res.values():
        assert_matches_reference(r, ref)
    assert_bit_equal(res["auto"], res["sm90"])
    assert not np.array_equal(res["sm90"][0].view(np.uint16), res["portable"][0].view(np.uint16))


@pytest.mark.parametrize("kernel", ["sm100", "sm90"])
def test_a_kernel_the_device_cannot_run_is_a_clear_error(kernel):
    clean_env()
    cc = compute_capability()
    runs = {"sm100": cc in ((10, 0), (10, 3)), "sm90": cc == (9, 0)}[kernel]
    if runs:
        pytest.skip(f"this GPU ({cc}) can run {kernel}")
    data = cases.make(cases.Case(lens=(100,), h_q=16, seed=9403))
    args = [jax.device_put(x, gpu()) for x in data.args]
    with pytest.raises(Exception) as e:
        np.asarray(jax_mla.mla_decode(*args, kernel=kernel))
    msg = str(e.value)
    assert f"kernel '{kernel}' (requested by the kernel argument) needs compute capability" in msg, msg
    assert f"this device has {cc[0]}.{cc[1]}" in msg, msg


def test_forced_self_check_passes_on_sm90(tmp_path):
    needs_sm90()
    res, stderr = run_worker(tmp_path, {"JAX_MLA_SELFCHECK": "force"}, "auto", "sm90", "portable")
    info = res["info"]
    assert info["self_check"] == "passed", info
    assert info["self_check_kernel"] == "sm90" and info["kernel"] == "sm90" and not info["fell_back"]
    assert info["env_self_check"] == "force"
    assert warnings(stderr) == [], stderr
    for k in ("auto", "sm90", "portable"):
        assert_matches_reference(res["results"][k], res["ref"])
    assert_bit_equal(res["results"]["auto"], res["results"]["sm90"])


def test_injected_fault_falls_back_to_portable_with_one_warning(tmp_path):
    needs_sm90()
    res, stderr = run_worker(tmp_path, {"JAX_MLA_SELFCHECK": "fault"}, "auto", "portable", "sm90")
    info = res["info"]
    assert info["self_check"] == "failed" and info["fell_back"] and info["kernel"] == "portable", info
    assert "out differs" in info["self_check_detail"], info
    lines = warnings(stderr)
    assert len(lines) == 1, stderr
    assert lines[0].startswith("jax_mla: WARNING: the sm90 kernel failed its self-check against the portable "
                               "kernel on CUDA device 0 (compute capability 9.0): bfloat16, case 'pieces': "
                               "out differs")
    assert lines[0].endswith('kernel="auto" uses the portable kernel on this device')
    for k in ("auto", "portable", "sm90"):
        assert_matches_reference(res["results"][k], res["ref"])
    # auto ran the portable kernel; an explicit request still gets the SM90 kernel.
    assert_bit_equal(res["results"]["auto"], res["results"]["portable"])
    assert not np.array_equal(res["results"]["sm90"][0].view(np.uint16),
                              res["results"]["portable"][0].view(np.uint16))


def test_environment_variable_selects_the_kernel(tmp_path):
    needs_sm90()
    res, stderr = run_worker(tmp_path, {"JAX_MLA_KERNEL": "portable"}, "--info-first", "auto", "portable", "sm90")
    assert res["info_before"]["kernel"] == "portable" and res["info"]["env_kernel"] == "portable"
    for k in ("auto", "portable", "sm90"):
        assert_matches_reference(res["results"][k], res["ref"])
    assert_bit_equal(res["results"]["auto"], res["results"]["portable"])  # env applies to auto
    # The explicit argument wins over the environment.
    assert not np.array_equal(res["results"]["sm90"][0].view(np.uint16),
                              res["results"]["portable"][0].view(np.uint16))
    res, _ = run_worker(tmp_path, {"JAX_MLA_KERNEL": "sm100"}, "auto", "portable")
    assert "kernel 'sm100' (requested by JAX_MLA_KERNEL) needs compute capability 10.0 or 10.3" in \
        res["results"]["auto"], res["results"]["auto"]
    assert "needs compute capability 10.0 or 10.3" in res["info"], res["info"]  # kernel_info says so too
    assert_matches_reference(res["results"]["portable"], res["ref"])


def test_invalid_environment_is_a_clear_error(tmp_path):
    res, _ = run_worker(tmp_path, {"JAX_MLA_KERNEL": "fast"}, "auto", "portable")
    assert "JAX_MLA_KERNEL must be one of 'auto', 'sm90', 'sm100', 'portable' (or unset), got 'fast'" in \
        res["results"]["auto"], res["results"]["auto"]
    assert "JAX_MLA_KERNEL must be one of" in res["info"], res["info"]
    assert_matches_reference(res["results"]["portable"], res["ref"])
    env = {k: v for k, v in os.environ.items() if k not in ENV_VARS and k != "JAX_PLATFORMS"}
    env["JAX_MLA_SELFCHECK"] = "yes"
    proc = subprocess.run([sys.executable, "-P", os.path.join(TESTS, "gpu_dispatch_worker.py"),
                           str(tmp_path / "x.pkl"), "auto"], cwd=str(tmp_path), env=env, capture_output=True,
                          text=True, timeout=600)
    # The decode fails in the initialize stage, and kernel_info (called afterwards) raises too; the
    # worker records both messages.
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(tmp_path / "x.pkl", "rb") as f:
        res = pickle.load(f)
    assert isinstance(res["results"]["auto"], str), "the decode ran despite an invalid JAX_MLA_SELFCHECK"
    assert "JAX_MLA_SELFCHECK must be one of 'force', 'fault', 'hang' (or unset), got 'yes'" in res["info"], res["info"]


@pytest.mark.parametrize("env", [{}, {"JAX_MLA_KERNEL": "portable"}], ids=["auto", "portable"])
def test_sparse_decode_on_each_kernel(tmp_path, env):
    """mla_decode_sparse takes the kernel auto picks for the cache (on an H100 / H200 the SM90
    kernel for an FP8 cache, whose producer warp gathers the one-token pages; portable for a 16-bit
    cache; JAX_MLA_KERNEL=portable forces portable): each matches float64 over a bf16 and an FP8
    cache."""
    res, _ = run_worker(tmp_path, env, "--sparse", "auto")
    for cache in ("bf16", "fp8", "fp8_unpacked"):
        got = res["sparse"][cache]
        assert not isinstance(got, str), got
        cases.assert_close_rel_l2(*got, *res["sparse_ref"][cache], out_tol=1e-2, lse_tol=1e-3)


def test_sparse_decode_kernel_choice_per_cache_format(tmp_path):
    """Which kernel auto runs, seen in the bits: on an SM90 device an FP8 cache's sparse decode runs
    the SM90 kernel, and a 16-bit cache's the portable kernel (bits equal to forced portable). Each
    kernel dequantizes exactly as unpack_fp8_kv: on the portable kernel the FP8 cache gives the
    bits of its unpacked 16-bit copy; the SM90 kernel's differ from them (its P V rounds P to 16
    bits), which shows it ran."""
    needs_sm90()
    if "sm90" not in jax_mla.kernel_info(gpu())["built"]:
        pytest.skip("the SM90 kernel is not in this build")
    runs = {}
    for name, env in (("auto", {}), ("portable", {"JAX_MLA_KERNEL": "portable"})):
        (tmp_path / name).mkdir()
        runs[name], _ = run_worker(tmp_path / name, env, "--sparse", "auto")
    auto, portable = runs["auto"], runs["portable"]
    assert_bit_equal(auto["sparse"]["bf16"], portable["sparse"]["bf16"])
    assert_bit_equal(auto["sparse"]["fp8_unpacked"], portable["sparse"]["fp8_unpacked"])
    assert_bit_equal(portable["sparse"]["fp8"], portable["sparse"]["fp8_unpacked"])
    a_out, p_out = auto["sparse"]["fp8"][0], portable["sparse"]["fp8"][0]
    assert not np.array_equal(a_out.view(np.uint8), p_out.view(np.uint8)), \
        "auto's FP8 sparse decode has the portable kernel's bits: the SM90 gather did not run"
