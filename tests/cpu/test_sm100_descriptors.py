"""Host unit test of the SM100 kernel's tcgen05 descriptor encoders (cuda/sm100/descriptors.h):
compiles tests/cpu/cpp/sm100_descriptors.cc, whose static_asserts hold values derived by hand from the
PTX ISA, with the host C++ compiler and runs it. Needs no GPU and no CUDA toolkit; skipped when no
C++ compiler is on PATH."""

from __future__ import annotations

from host_cpp import build_and_run


def test_sm100_descriptor_encoders(tmp_path):
    run = build_and_run("sm100_descriptors.cc", tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1] == "ok"
    assert "idesc_qk_bf16=0x04100490 idesc_pv_bf16=0x04410490" in run.stdout
