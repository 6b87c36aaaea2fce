"""benchmarks/bench_sharded.py (issue #8's two-GPU run) on two forced CPU devices: it runs, its
checks pass on a correct op, and the checks themselves can fail."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax.numpy as jnp
import numpy as np

from script_loader import ROOT, load_script


def test_runs_on_two_cpu_devices(tmp_path, cpu_devices_env):
    out = tmp_path / "sharded.json"
    env = cpu_devices_env(2)
    proc = subprocess.run([sys.executable, "-P", os.path.join(ROOT, "benchmarks", "bench_sharded.py"),
                           "--only", "tiny_b4_h16_300", "--calls", "2", "--repeats", "1", "--json", str(out)],
                          cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["devices"] == 2 and row["op_in_hlo"]
    assert row["dp_bit_identical"] and row["tp_agrees"]
    assert row["collectives"] == {"data parallel": [], "tensor parallel": []}
    assert row["us_one"] > 0 and row["us_dp"] > 0 and row["us_tp"] > 0


def test_refuses_one_device(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run([sys.executable, "-P", os.path.join(ROOT, "benchmarks", "bench_sharded.py"),
                           "--only", "tiny_b4_h16_300"], cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "needs 2.." in proc.stderr


def test_checks_can_fail():
    m = load_script("benchmarks/bench_sharded.py")
    assert m.collectives('%x = f32[8] all-gather-start(%p), dims={0}\n%y = all-reduce(%x)') == [
        "all-gather-start", "all-reduce"]
    assert m.collectives('custom_call_target="jax_mla_decode"') == []
    bf16 = jnp.bfloat16  # the op's output type: its rounding sets the tolerance
    rng = np.random.default_rng(0)
    out = rng.standard_normal((2, 1, 4, 512)).astype(np.float32)
    out[1, 0, 3, 7] = 0.5
    lse = rng.standard_normal((2, 1, 4)).astype(np.float32)
    assert m.agree((out, lse), (out.copy(), lse.copy()), bf16)
    bad = out.copy()
    bad[1, 0, 3, 7] += 1e-2
    assert not m.agree((bad, lse), (out, lse), bf16)
    bad_lse = lse.copy()
    bad_lse[0, 0, 0] = -np.inf
    assert not m.agree((out, bad_lse), (out, lse), bf16)
    nan = out.copy()
    nan[0, 0, 0, 0] = np.nan
    assert not m.agree((nan, lse), (out, lse), bf16)
