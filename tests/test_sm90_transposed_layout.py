"""Host unit test of the SM90 transposed kernel's index math (cuda/sm90/transposed_layout.h):
compiles tests/cpp/sm90_transposed_layout.cc (static_asserts with hand-derived values, and loops
that check the accumulator, output and P-buffer mappings cover every element once) with the host
C++ compiler and runs it. Needs no GPU and no CUDA toolkit; skipped when no C++ compiler is on PATH.
The wgmma descriptors and the hardware's reading of them are not covered: only a GPU run checks those."""

from __future__ import annotations

import os
import subprocess

import pytest

from test_sm100_descriptors import _compiler

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)


def test_sm90_transposed_layout(tmp_path):
    cxx = _compiler()
    if cxx is None:
        pytest.skip("no C++ compiler on PATH")
    exe = tmp_path / "sm90_transposed_layout"
    build = subprocess.run(
        [cxx, "-std=c++17", "-Wall", "-Wextra", "-Werror", "-I", os.path.join(ROOT, "cuda"),
         os.path.join(TESTS, "cpp", "sm90_transposed_layout.cc"), "-o", str(exe)],
        capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.splitlines()[-1] == "ok"
