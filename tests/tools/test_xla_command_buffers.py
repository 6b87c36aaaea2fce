"""benchmarks/xla_command_buffers.py: counts jax_mla calls inside and outside command buffers."""

from __future__ import annotations

from script_loader import load_script


def _load():
    return load_script("benchmarks/xla_command_buffers.py")


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


def test_counts_calls_inside_dynamic_slice_fusions(tmp_path):
    # The benchmark's step: each call's block table is tables[i], fused into the call's addressing.
    hlo = _HLO.replace("%command_buffer (p0", "%dynamic-slice-fusion.3 (p0").replace(
        "to_apply=%command_buffer", "to_apply=%dynamic-slice-fusion.3")
    path = tmp_path / "m.txt"
    path.write_text(hlo)
    s = _load().summarize(str(path))
    assert s["in_dynamic_slice_fusions"] == {"jax_mla_decode": 1}
    assert s["in_command_buffers"] == {}


_LOG = """\
I1203 16:22:53.658613    4257 command_buffer_conversion_pass.cc:392] Thunk kind kDynamicSliceFusion lowering is not enabled by the user for type DYNAMIC_SLICE_FUSION
I1203 16:22:53.658613    4257 command_buffer_conversion_pass.cc:392] Thunk kind kDynamicSliceFusion lowering is not enabled by the user for type DYNAMIC_SLICE_FUSION
I1203 16:22:53.658614    4257 command_buffer_conversion_pass.cc:564] Creating command buffer thunk with the following thunks: loop_add_fusion
I1203 16:22:57.616211    4484 command_buffer_conversion_pass.cc:564] Creating command buffer thunk with the following thunks: input_scatter_fusion, loop_add_fusion, mla_decode_schedule.1, mla_decode.8, wrapped_negate, mla_decode.12
"""


def test_reads_command_buffers_from_the_conversion_log(tmp_path):
    path = tmp_path / "run.log"
    path.write_text(_LOG)
    s = _load().summarize_log(str(path))
    assert s["command_buffers"] == 2
    assert s["decode_thunks_in_command_buffers"] == 2  # mla_decode_schedule.1 is not a decode call
    assert s["not_enabled"] == {"DYNAMIC_SLICE_FUSION": 2}
