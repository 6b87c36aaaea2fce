"""jax.export of a whole decode step (cache update, schedule, attention): serialized here and run
in a FRESH process (tests/api/export_worker.py), for the CPU alone and for ("cpu", "cuda"); on a GPU
machine also for ("cuda",), run on the GPU."""

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

TESTS = os.path.dirname(os.path.abspath(__file__))
H_Q = 16


pytestmark = pytest.mark.usefixtures("on_cpu")  # jax's default device: the CPU (conftest.py)


def decode_step(q, kv_cache, block_table, seq_lens, new_latent):
    """Append one token per request, then attend over the cache with a shared schedule."""
    kv_cache = jax_mla.update_kv_cache(kv_cache, new_latent, block_table, seq_lens[:, None])
    seq_lens = seq_lens + 1
    schedule = jax_mla.decode_schedule(seq_lens, num_heads=H_Q)
    out, lse = jax_mla.mla_decode(q, kv_cache, block_table, seq_lens, causal=True,
                                  return_lse=True, schedule=schedule)
    return out, lse, kv_cache


def step_inputs():
    # Lengths that are not multiples of the page size: the new token fits an allocated page.
    data = cases.make(cases.Case(lens=(5, 30, 17), h_q=H_Q, page_size=16, seed=90))
    new = np.random.default_rng(91).standard_normal((3, 1, 576)).astype(data.kv_cache.dtype)
    return [data.q, data.kv_cache, data.block_table, data.seq_lens, new]


def test_exported_step_runs_in_a_fresh_process(tmp_path):
    args = step_inputs()
    fn = jax.jit(decode_step)
    want = [np.asarray(x) for x in fn(*args)]
    ref_out, ref_lse = jax.jit(jax_mla.reference.mla_decode_reference,
                               static_argnames="causal")(args[0], want[2], args[2], args[3] + 1,
                                                         causal=True)
    np.testing.assert_allclose(np.asarray(want[0], np.float32), np.asarray(ref_out, np.float32),
                               atol=2e-2, rtol=2e-2)

    with open(tmp_path / "inputs.pkl", "wb") as f:
        pickle.dump(args, f)
    for name, platforms in (("cpu", None), ("cpu_cuda", ("cpu", "cuda"))):
        exp = jax.export.export(fn, platforms=platforms,
                                disabled_checks=jax_mla.export_disabled_checks())(*args)
        assert exp.platforms == (platforms or ("cpu",))
        text = exp.mlir_module()
        assert "jax_mla_decode" in text and "jax_mla_decode_schedule" in text
        (tmp_path / f"{name}.bin").write_bytes(exp.serialize())
        with open(tmp_path / f"{name}.pkl", "wb") as f:
            pickle.dump(want, f)

    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-P", os.path.join(TESTS, "export_worker.py"),
                           str(tmp_path)], cwd=str(tmp_path), env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr[-4000:]}"
    assert "cpu: ok" in proc.stdout and "cpu_cuda: ok" in proc.stdout, proc.stdout
    assert "before import jax_mla: refused" in proc.stdout, proc.stdout


def test_cuda_export_lowers_on_a_cpu_only_machine():
    """platforms=("cuda",) alone: lowering needs no GPU (the CUDA workspace result is there)."""
    args = step_inputs()
    exp = jax.export.export(jax.jit(decode_step), platforms=("cuda",),
                            disabled_checks=jax_mla.export_disabled_checks())(*args)
    text = exp.mlir_module()
    assert exp.platforms == ("cuda",)
    assert "ui8" in text and "stablehlo.scatter" in text
    assert len(exp.serialize()) > 0


@pytest.mark.gpu
def test_cuda_export_runs_in_a_fresh_process_on_the_gpu(tmp_path):
    """The same decode step exported for ("cuda",), serialized, and run on the GPU in a fresh
    process: bit-identical to running the jitted step in this process, and close to the reference."""
    gpu = jax.devices("gpu")[0]
    args = [jax.device_put(x, gpu) for x in step_inputs()]
    fn = jax.jit(decode_step)
    want = [np.asarray(x) for x in fn(*args)]
    with jax.default_device(jax.devices("cpu")[0]):
        host = [np.asarray(x) for x in args]
        ref_out, _ = jax.jit(jax_mla.reference.mla_decode_reference,
                             static_argnames="causal")(host[0], want[2], host[2], host[3] + 1, causal=True)
    np.testing.assert_allclose(np.asarray(want[0], np.float32), np.asarray(ref_out, np.float32),
                               atol=2e-2, rtol=2e-2)

    exp = jax.export.export(fn, platforms=("cuda",),
                            disabled_checks=jax_mla.export_disabled_checks())(*args)
    (tmp_path / "cuda.bin").write_bytes(exp.serialize())
    with open(tmp_path / "inputs.pkl", "wb") as f:
        pickle.dump(host, f)
    with open(tmp_path / "cuda.pkl", "wb") as f:
        pickle.dump(want, f)
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    proc = subprocess.run([sys.executable, "-P", os.path.join(TESTS, "export_worker.py"),
                           str(tmp_path)], cwd=str(tmp_path), env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr[-4000:]}"
    assert "cuda: ok (platforms ('cuda',))" in proc.stdout, proc.stdout


# ----------------------------------------------------------------------------------------------
# The same step over an FP8 cache (uint8 rows of 656 bytes): the update quantizes, the decode reads
# ----------------------------------------------------------------------------------------------

def step_inputs_fp8():
    data = cases.make_fp8(cases.Case(lens=(5, 30, 17), h_q=H_Q, page_size=16, seed=92))
    new = np.random.default_rng(93).standard_normal((3, 1, 576)).astype(np.float32)
    return [data.q, data.kv_cache, data.block_table, data.seq_lens, new]


def fp8_platforms():
    """Export targets for the FP8 step: the CPU, and CUDA once a GPU kernel reads the format
    (until then lowering for CUDA refuses it: test_fp8_cuda_export_is_refused_until_a_kernel_reads_it)."""
    both = ("cpu", "cuda") if jax_mla._validate.FP8_KERNELS else None
    return [("cpu", None)] + ([("cpu_cuda", both)] if both else [])


def test_exported_fp8_step_runs_in_a_fresh_process(tmp_path):
    args = step_inputs_fp8()
    fn = jax.jit(decode_step)
    want = [np.asarray(x) for x in fn(*args)]
    assert want[2].dtype == np.uint8 and want[2].shape == args[1].shape
    ref_out, _ = jax.jit(jax_mla.reference.mla_decode_reference,
                         static_argnames="causal")(args[0], want[2], args[2], args[3] + 1, causal=True)
    np.testing.assert_allclose(np.asarray(want[0], np.float32), np.asarray(ref_out, np.float32),
                               atol=2e-2, rtol=2e-2)
    with open(tmp_path / "inputs.pkl", "wb") as f:
        pickle.dump(args, f)
    names = []
    for name, platforms in fp8_platforms():
        exp = jax.export.export(fn, platforms=platforms,
                                disabled_checks=jax_mla.export_disabled_checks())(*args)
        text = exp.mlir_module()
        assert "jax_mla_decode" in text and "656xui8" in text
        (tmp_path / f"{name}.bin").write_bytes(exp.serialize())
        with open(tmp_path / f"{name}.pkl", "wb") as f:
            pickle.dump(want, f)
        names.append(name)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-P", os.path.join(TESTS, "export_worker.py"),
                           str(tmp_path)], cwd=str(tmp_path), env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr[-4000:]}"
    for name in names:
        assert f"{name}: ok" in proc.stdout, proc.stdout


def test_fp8_cuda_export_is_refused_until_a_kernel_reads_it():
    args = step_inputs_fp8()
    export = jax.export.export(jax.jit(decode_step), platforms=("cuda",),
                               disabled_checks=jax_mla.export_disabled_checks())
    if jax_mla._validate.FP8_KERNELS:
        assert "656xui8" in export(*args).mlir_module()
    else:
        with pytest.raises(ValueError, match="on CUDA, no kernel reads an FP8 kv_cache"):
            export(*args)
