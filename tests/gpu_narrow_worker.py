"""The SM90 kernel's shapes for <= 16 query rows (cuda/sm90/config.h; off by default,
JAX_MLA_SM90_NARROW=1, transposed, transposed_pipelined or transposed_splitk) on every case of tests/test_gpu.py with at
most 16 query rows, against the CPU reference. Run by
tests/test_gpu_narrow.py in a subprocess, since the CUDA handler reads JAX_MLA_SM90_NARROW once per
process. Prints one line per case; exits non-zero when a case fails or none ran."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax_mla  # noqa: E402
import test_gpu  # noqa: E402  (its case lists and checks; importing it runs no test)
from sm90_shape_check import shape_check_failure  # noqa: E402


def narrow_cases():
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
    # The cases must have run on the requested shape (sm90_shape_check.py).
    failure = shape_check_failure()
    if failure:
        bad += 1
        print("FAIL", failure, flush=True)
    print(f"launches: {jax_mla._ext.cuda_call_stats()}", flush=True)
    print(f"{ran} cases, {bad} failed", flush=True)
    return 1 if bad or not ran else 0


if __name__ == "__main__":
    sys.exit(main())
