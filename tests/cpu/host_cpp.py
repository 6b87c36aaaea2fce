"""Builds and runs a host C++ unit test from tests/cpu/cpp/ (no GPU, no CUDA toolkit), for
test_sm100_descriptors.py and test_self_check_coverage.py. Not collected by pytest."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def compiler():
    for name in (os.environ.get("CXX", ""), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def build_and_run(source: str, tmp_path, flags=()) -> subprocess.CompletedProcess:
    """Compiles tests/cpu/cpp/<source> (-Wall -Wextra -Werror, cuda/ on the include path, plus `flags`)
    and runs it; skips the calling test when there is no C++ compiler, fails it when the build fails."""
    cxx = compiler()
    if cxx is None:
        pytest.skip("no C++ compiler on PATH")
    exe = tmp_path / os.path.splitext(source)[0]
    build = subprocess.run(
        [cxx, "-std=c++17", "-Wall", "-Wextra", "-Werror", *flags, "-I", os.path.join(ROOT, "cuda"),
         os.path.join(HERE, "cpp", source), "-o", str(exe)],
        capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    return subprocess.run([str(exe)], capture_output=True, text=True)
