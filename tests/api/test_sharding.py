"""mla_decode and update_kv_cache over 8 CPU devices: batch (data parallel) and head (tensor
parallel) sharding over Explicit and Auto mesh axes, alone and inside a step with projections,
inside shard_map, the schedule under sharding, resharded layouts, export of a sharded step.

The checks live in sharding_worker.py and run in ONE subprocess started with
XLA_FLAGS=--xla_force_host_platform_device_count=8 (the flag must be set before jax initialises,
which has already happened in this process); each test reports one check's result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import sharding_worker

TESTS = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def results(tmp_path_factory, cpu_devices_env):
    out = tmp_path_factory.mktemp("sharding") / "results.json"
    env = cpu_devices_env(sharding_worker.NUM_DEVICES)
    # -P and a neutral cwd: import the installed jax_mla, not the checkout's folder.
    proc = subprocess.run([sys.executable, "-P", os.path.join(TESTS, "sharding_worker.py"),
                           str(out)], cwd=str(out.parent), env=env, capture_output=True,
                          text=True, timeout=600)
    if not out.exists():
        pytest.fail(f"sharding worker failed (exit {proc.returncode}):\n{proc.stdout}\n"
                    f"{proc.stderr[-4000:]}", pytrace=False)
    return json.loads(out.read_text())


@pytest.mark.parametrize("name", sorted(sharding_worker.CHECKS))
def test_sharding(results, name):
    r = results[name]
    if not r["ok"]:
        pytest.fail(f"{name} (in the 8-device subprocess):\n{r['error']}", pytrace=False)
