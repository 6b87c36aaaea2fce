"""Host unit test of the FP8 cache's e4m3 -> bf16 / fp16 dequantization helpers
(cuda/common/fp8_convert.cuh): compiles tests/cpu/cpp/fp8_convert.cc, which checks the fast path
(byte placement times one 16-bit factor) against float(e4m3) * scale rounded once, exhaustively over
the e4m3 bytes and the power-of-two scales, with the host C++ compiler and runs it. Then compares the
program's reference rounding (fp32 -> bf16 / fp16, round to nearest even) on its printed samples with
numpy's float16 and ml_dtypes' bfloat16 (when installed). Needs no GPU and no CUDA toolkit; skipped
when no C++ compiler is on PATH."""

from __future__ import annotations

import re

import numpy as np
import pytest

from host_cpp import build_and_run

SAMPLE = re.compile(r"^sample f32=0x([0-9a-f]{8}) bf16=0x([0-9a-f]{4}) fp16=0x([0-9a-f]{4})$")


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    run = build_and_run("fp8_convert.cc", tmp_path_factory.mktemp("fp8_convert"))
    return run


def _samples(stdout: str):
    rows = [SAMPLE.match(line) for line in stdout.splitlines()]
    rows = [m for m in rows if m]
    f32 = np.array([int(m.group(1), 16) for m in rows], dtype=np.uint32)
    bf16 = np.array([int(m.group(2), 16) for m in rows], dtype=np.uint16)
    fp16 = np.array([int(m.group(3), 16) for m in rows], dtype=np.uint16)
    return f32, bf16, fp16


def test_fp8_fast_path_exhaustive(program):
    assert program.returncode == 0, program.stdout[-4000:] + program.stderr
    out = program.stdout
    assert out.splitlines()[-1] == "ok"
    assert "MISMATCH" not in out
    # The accepted scale exponents (the header's documented ranges).
    assert "bf16: fast path accepts k in [-117, 7] (+-0 too)" in out
    assert "fp16: fast path accepts k in [-22, 7] (+-0 too)" in out
    assert "e4m3_nan_bytes: 65536 words" in out


def test_reference_rounding_matches_numpy(program):
    assert program.returncode == 0, program.stderr
    f32, _, fp16 = _samples(program.stdout)
    assert len(f32) > 100
    with np.errstate(all="ignore"):  # the overflow samples
        want = f32.view(np.float32).astype(np.float16).view(np.uint16)  # numpy: RNE, subnormals, inf
    bad = np.nonzero(want != fp16)[0]
    assert bad.size == 0, [(hex(f32[i]), hex(fp16[i]), hex(want[i])) for i in bad[:10]]


def test_reference_rounding_matches_ml_dtypes(program):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    assert program.returncode == 0, program.stderr
    f32, bf16, _ = _samples(program.stdout)
    with np.errstate(all="ignore"):
        want = f32.view(np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)
    bad = np.nonzero(want != bf16)[0]
    assert bad.size == 0, [(hex(f32[i]), hex(bf16[i]), hex(want[i])) for i in bad[:10]]
