"""The runtime settings (cuda/runtime/settings.h): JAX_MLA_KERNEL, JAX_MLA_SELFCHECK and
JAX_MLA_CPU_ISA, parsed in one place, with one message format for a bad value."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from jax_mla._ext import testing

KERNELS = "one of 'auto', 'sm90', 'sm100', 'portable'"


@pytest.mark.parametrize("kernel, self_check, cpu_isa", [
    (None, None, None), ("", "", ""), ("auto", "force", "generic"), ("sm90", "fault", None), ("portable", "hang", None),
    ("sm100", None, None), ("portable", None, None)])
def test_accepted_values(kernel, self_check, cpu_isa):
    parsed = testing.parse_settings(kernel, self_check, cpu_isa)
    assert parsed == {"JAX_MLA_KERNEL": (kernel or "", ""), "JAX_MLA_SELFCHECK": (self_check or "", ""),
                      "JAX_MLA_CPU_ISA": (cpu_isa or "", "")}


@pytest.mark.parametrize("field, value, accepted", [
    ("kernel", "SM90", KERNELS), ("kernel", "fast", KERNELS), ("self_check", "on", "one of 'force', 'fault', 'hang'"),
    ("cpu_isa", "avx2", "'generic'")])
def test_bad_values_name_the_variable_and_the_choices(field, value, accepted):
    parsed = testing.parse_settings(**{field: value})
    name = {"kernel": "JAX_MLA_KERNEL", "self_check": "JAX_MLA_SELFCHECK",
            "cpu_isa": "JAX_MLA_CPU_ISA"}[field]
    assert parsed[name] == (value, f"{name} must be {accepted} (or unset), got '{value}'")


_DECODE = """
import jax_mla, numpy as np, ml_dtypes
q = np.zeros((1, 1, 1, 576), ml_dtypes.bfloat16)
kv = np.zeros((1, 16, 576), ml_dtypes.bfloat16)
jax_mla.mla_decode(q, kv, np.zeros((1, 1), np.int32), np.ones((1,), np.int32)).block_until_ready()
print("ok")
"""


def test_bad_cpu_isa_fails_the_cpu_decode():
    env = dict(os.environ, JAX_MLA_CPU_ISA="avx512", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-P", "-c", _DECODE], env=env, capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.abspath(__file__)))
    assert proc.returncode != 0
    assert "JAX_MLA_CPU_ISA must be 'generic' (or unset), got 'avx512'" in proc.stderr, proc.stderr[-2000:]
    env["JAX_MLA_CPU_ISA"] = "generic"
    proc = subprocess.run([sys.executable, "-P", "-c", _DECODE], env=env, capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.abspath(__file__)))
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
