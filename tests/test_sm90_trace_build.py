"""The SM90 event-trace debug build (CMake JAX_MLA_SM90_TRACE, cuda/sm90/trace.cuh) still compiles:
the kernel instantiation and the CUDA handler, with nvcc for sm_90a, compile only. Normal builds
compile the trace out, so nothing else would notice if it broke. Skipped without nvcc."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("source", ["cuda/sm90/instantiations/decode_bf16.cu", "cuda/ffi/cuda_handler.cu"])
def test_trace_build_compiles(tmp_path, source):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc on PATH")
    jax = pytest.importorskip("jax")
    cmd = [nvcc, "-std=c++17", "-O1", "--expt-relaxed-constexpr", "-arch=sm_90a", "-DJAX_MLA_WITH_CUDA",
           "-DJAX_MLA_HAVE_SM90", "-DJAX_MLA_SM90_TRACE=1", "-I", os.path.join(ROOT, "cuda"),
           "-isystem", jax.ffi.include_dir(), "-c", os.path.join(ROOT, source), "-o", str(tmp_path / "out.o")]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
