"""mla_decode_sparse sharded over 8 forced CPU devices (tests/api/sparse_sharding_worker.py, in a
subprocess: the device count must be set before jax initialises)."""

from __future__ import annotations

import os
import subprocess
import sys

TESTS = os.path.dirname(os.path.abspath(__file__))


def test_sparse_sharding(cpu_devices_env):
    proc = subprocess.run([sys.executable, "-P", os.path.join(TESTS, "sparse_sharding_worker.py")],
                          env=cpu_devices_env(8), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("explicit_batch_heads", "explicit_cache_pages_split", "explicit_batch_only_heads_only",
                 "auto_batch_heads", "auto_batch_heads_committed", "auto_batch_heads_gspmd",
                 "auto_cache_pages_split", "auto_from_indices_and_sink", "auto_vmapped_sinks",
                 "auto_export_is_refused"):
        assert f"{name}: ok" in proc.stdout, proc.stdout
