"""Host unit test of the SM90 transposed kernel's index math (cuda/sm90/transposed_layout.h):
compiles tests/cpp/sm90_transposed_layout.cc (static_asserts with hand-derived values, and loops
that check the accumulator, output and P-buffer mappings cover every element once) with the host
C++ compiler and runs it. Needs no GPU and no CUDA toolkit; skipped when no C++ compiler is on PATH.
The wgmma descriptors and the hardware's reading of them are not covered: only a GPU run checks those."""

from __future__ import annotations

from host_cpp import build_and_run


def test_sm90_transposed_layout(tmp_path):
    run = build_and_run("sm90_transposed_layout.cc", tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.splitlines()[-1] == "ok"
