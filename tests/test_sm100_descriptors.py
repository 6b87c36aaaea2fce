"""Host unit test of the SM100 kernel's tcgen05 descriptor encoders (cuda/sm100/descriptors.h):
compiles tests/cpp/sm100_descriptors.cc, whose static_asserts hold values derived by hand from the
PTX ISA, with the host C++ compiler and runs it. Needs no GPU and no CUDA toolkit; skipped when no
C++ compiler is on PATH."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)


def _compiler():
    for name in (os.environ.get("CXX", ""), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def test_sm100_descriptor_encoders(tmp_path):
    cxx = _compiler()
    if cxx is None:
        pytest.skip("no C++ compiler on PATH")
    exe = tmp_path / "sm100_descriptors"
    build = subprocess.run(
        [cxx, "-std=c++17", "-Wall", "-Wextra", "-Werror", "-I", os.path.join(ROOT, "cuda"),
         os.path.join(TESTS, "cpp", "sm100_descriptors.cc"), "-o", str(exe)],
        capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1] == "ok"
    assert "idesc_qk_bf16=0x04100490 idesc_pv_bf16=0x04410490" in run.stdout
