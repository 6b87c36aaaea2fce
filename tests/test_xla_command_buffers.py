"""benchmarks/xla_command_buffers.py: counts jax_mla calls inside and outside command buffers."""

from __future__ import annotations

import importlib.util
import os

_PATH = os.path.join(os.path.dirname(__file__), os.pardir, "benchmarks", "xla_command_buffers.py")


def _load():
    spec = importlib.util.spec_from_file_location("xla_command_buffers", _PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_HLO = """HloModule jit_step, entry_computation_layout={()->f32[]}

%command_buffer (p0: s32[4]) -> u8[10] {
  %p0 = s32[4]{0} parameter(0)
  ROOT %cc = (bf16[1], u8[10]) custom-call(%p0), custom_call_target="jax_mla_decode"
}

%fused_add (a: f32[]) -> f32[] {
  ROOT %a = f32[] parameter(0)
}

ENTRY %main.10 (Arg_0.1: s32[4]) -> f32[] {
  %Arg_0.1 = s32[4]{0} parameter(0)
  %s = s32[4] custom-call(%Arg_0.1), custom_call_target="jax_mla_decode_schedule"
  %cc2 = (bf16[1], u8[10]) custom-call(%s), custom_call_target="jax_mla_decode"
  %cc3 = (bf16[1], u8[10]) custom-call(%s), custom_call_target="jax_mla_decode"
  %call = u8[10] call(%Arg_0.1), to_apply=%command_buffer
}
"""


def test_counts_calls_inside_command_buffer_computations(tmp_path):
    path = tmp_path / "module_0001.jit_step.gpu_after_optimizations.txt"
    path.write_text(_HLO)
    s = _load().summarize(str(path))
    assert s["total"] == {"jax_mla_decode": 3, "jax_mla_decode_schedule": 1}
    assert s["in_command_buffers"] == {"jax_mla_decode": 1}
    assert s["command_buffer_computations"] == 1


def test_module_without_command_buffers(tmp_path):
    path = tmp_path / "m.txt"
    path.write_text(_HLO.replace("%command_buffer", "%plain_call"))
    s = _load().summarize(str(path))
    assert s["in_command_buffers"] == {}
    assert s["command_buffer_computations"] == 0
