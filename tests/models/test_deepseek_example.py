"""examples/deepseek_v3_mla.py at tiny sizes: on one device in this process, and batch-sharded
over two CPU devices in a subprocess (where the decode step must compile with no collective)."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
from script_loader import ROOT, load_script

EXAMPLE = os.path.join(ROOT, "examples", "deepseek_v3_mla.py")
TINY = ["--heads", "4", "--layers", "2", "--prompt", "16", "--steps", "3", "--d-model", "256",
        "--q-lora-rank", "64", "--page-size", "8", "--device", "cpu"]


def test_example_one_device(capsys):
    example = load_script("examples/deepseek_v3_mla.py")
    with jax.default_device(jax.devices("cpu")[0]):
        assert example.main(TINY + ["--no-shard", "--batch", "3", "--layers", "1",
                                    "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "OK: 2 decode steps x 3 requests" in out and "2/2" in out and "tok/s" in out


def test_example_batch_sharded_over_two_devices(tmp_path, cpu_devices_env):
    env = cpu_devices_env(2)
    proc = subprocess.run([sys.executable, "-P", EXAMPLE, *TINY], cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr[-4000:]}"
    assert "2 x cpu (cpu), batch sharded over devices" in proc.stdout, proc.stdout
    assert "collectives in the compiled decode step: none" in proc.stdout, proc.stdout
    assert "OK: 3 decode steps x 4 requests" in proc.stdout, proc.stdout

