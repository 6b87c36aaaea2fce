"""CUDA graphs: a decode step with jax_mla's custom calls captured by XLA command buffers and
replayed while seq_lens, the block table and q change between steps.

XLA reads XLA_FLAGS once per process, so each configuration runs tests/gpu/gpu_graphs_worker.py in a
subprocess: once with command buffers on for custom calls (and graphs of any size), once with them
off. The worker checks every step against the CPU reference. Here the decode handler must have run
while its stream was capturing into a CUDA graph with command buffers on, and never without them
(the handler counts it: _ext.testing.cuda_call_stats()), and both runs must agree bit for bit. (Recent XLA
forms command buffers from the thunk sequence, so the HLO text no longer shows them; older XLA
outlined them into command_buffer* computations, which are checked when present.) It runs with the
device's own kernel and with the portable kernel forced (JAX_MLA_KERNEL=portable), and over an FP8
cache (uint8 rows of 656 bytes, JAX_MLA_GRAPHS_FP8=1: the kernel that reads them).
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import numpy as np
import pytest

import cases

pytestmark = pytest.mark.gpu

TESTS = os.path.dirname(os.path.abspath(__file__))
GRAPHS = "--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1"
NO_GRAPHS = "--xla_gpu_enable_command_buffer="


def run_worker(tmp_path, name, xla_flags, kernel="", fp8=False):
    out = tmp_path / f"{name}.pkl"
    env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " " + xla_flags).strip())
    env.pop("JAX_PLATFORMS", None)
    env["JAX_MLA_KERNEL"] = kernel  # "" (auto) or a forced kernel for the whole step
    env["JAX_MLA_GRAPHS_FP8"] = "1" if fp8 else ""
    proc = subprocess.run([sys.executable, "-P", os.path.join(TESTS, "gpu_graphs_worker.py"),
                           str(out)], cwd=str(tmp_path), env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, f"{name}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-6000:]}"
    with open(out, "rb") as f:
        return pickle.load(f)


def computations(hlo_text):
    """{name: body} of the computations of an HLO module's text."""
    comps, name, body = {}, None, []
    for line in hlo_text.splitlines():
        if name is None and line.startswith(("%", "ENTRY ")) and line.rstrip().endswith("{"):
            name, body = line.split()[1 if line.startswith("ENTRY") else 0].lstrip("%"), []
        elif name is not None and line.startswith("}"):
            comps[name] = "\n".join(body)
            name = None
        elif name is not None:
            body.append(line)
    return comps


@pytest.mark.parametrize("kernel, fp8", [("", False), ("portable", False), ("", True)],
                         ids=["auto", "portable", "fp8"])
def test_decode_step_replays_in_a_cuda_graph(tmp_path, kernel, fp8):
    if fp8 and not cases.gpu_fp8_reader():
        pytest.skip(cases.NO_GPU_FP8_READER)
    graphs = run_worker(tmp_path, "graphs", GRAPHS, kernel, fp8)
    plain = run_worker(tmp_path, "plain", NO_GRAPHS, kernel, fp8)
    assert graphs["stats"]["decode_captured"] >= 2, graphs["stats"]  # both layers traced
    assert plain["stats"]["decode_captured"] == 0, plain["stats"]
    assert plain["stats"]["decode_calls"] >= 2 * len(plain["results"]), plain["stats"]
    buffers = {n: b for n, b in computations(graphs["hlo"]).items()
               if n.startswith("command_buffer")}
    if buffers:  # XLA versions that outline command buffers in HLO
        captured = "\n".join(buffers.values())
        assert captured.count('custom_call_target="jax_mla_decode"') == 2, captured
        assert 'custom_call_target="jax_mla_decode_schedule"' in captured, captured
    assert not any(n.startswith("command_buffer") for n in computations(plain["hlo"]))
    assert len(graphs["results"]) == len(plain["results"]) >= 4
    for k, (g, p) in enumerate(zip(graphs["results"], plain["results"])):
        for i, (a, b) in enumerate(zip(g, p)):
            np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8),
                                          err_msg=f"step {k}, result {i}: graph replay differs")
