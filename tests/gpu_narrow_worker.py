"""The SM90 kernel's shapes for <= 16 query rows (cuda/sm90/config.h; off by default,
JAX_MLA_SM90_NARROW=1, transposed, transposed_pipelined or transposed_splitk) on every case of tests/test_gpu.py with at
most 16 query rows, against the CPU reference; with JAX_MLA_SM90_TRANSPOSED_ROWS=all, the transposed
kernel on every case of test_gpu.CASES (all row counts). Run by
tests/test_gpu_narrow.py in a subprocess, since the CUDA handler reads JAX_MLA_SM90_NARROW once per
process. Prints one line per case; exits non-zero when a case fails or none ran."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax_mla  # noqa: E402
import test_gpu  # noqa: E402  (its case lists and checks; importing it runs no test)


def narrow_cases():
    if os.environ.get("JAX_MLA_SM90_TRANSPOSED_ROWS") == "all":  # every request on the transposed kernel
        return list(test_gpu.CASES)
    return [c for c in test_gpu.CASES + test_gpu.LARGE_CASES if c.s_q * c.h_q <= 16]


def main() -> int:
    bad = ran = 0
    for case in narrow_cases():
        data, ref = test_gpu.prepared(case)
        try:
            test_gpu.check(data, *test_gpu.run_gpu(data, kernel="auto"), ref=ref)
            print("ok  ", case.id, flush=True)
        except AssertionError as e:
            bad += 1
            print("FAIL", case.id, str(e)[:400], flush=True)
        ran += 1
    # The cases must have run on the requested shape, not silently on the wide one (an unread or
    # misspelt variable, or a device other than SM90, where the shape does not exist).
    stats = jax_mla._ext.cuda_call_stats()
    shape = os.environ.get("JAX_MLA_SM90_NARROW", "0")
    key = "sm90_narrow_launches" if shape == "1" else "sm90_transposed_launches" if shape.startswith("transposed") else None
    on_sm90 = jax_mla.kernel_info().get("kernel") == "sm90"
    if key and on_sm90 and not stats.get(key):
        bad += 1
        print(f"FAIL JAX_MLA_SM90_NARROW={shape} but no launch on that shape: {stats}", flush=True)
    print(f"launches: {stats}", flush=True)
    print(f"{ran} cases, {bad} failed", flush=True)
    return 1 if bad or not ran else 0


if __name__ == "__main__":
    sys.exit(main())
