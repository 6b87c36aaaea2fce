"""SM90 split parts (JAX_MLA_SM90_SPLIT=k: each split-KV part on a cluster of k CTAs per row block,
merged in the cluster, cuda/sm90/split_combine.cuh) on every case of tests/test_gpu.py and the
larger cases, against the CPU reference. Each case runs twice: with the default part count (k times
more CTAs than SMs, so several waves of clusters) and with num_sms // (row blocks * k) parts (one
wave: the shape the split is for, where many pieces have fewer blocks than CTAs and some CTAs' runs
are empty). A second identical call must give the same bits. Run by tests/test_gpu_split.py in a
subprocess, since the CUDA handler reads JAX_MLA_SM90_SPLIT once per process. Prints one line per
case; exits non-zero when a case fails or none ran."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import numpy as np  # noqa: E402

import jax_mla  # noqa: E402
import test_gpu  # noqa: E402  (its case lists and checks; importing it runs no test)


def one_wave_parts(case, split: int) -> int:
    m_blocks = -(-(case.s_q * case.h_q) // 64)
    return max(1, jax_mla._ext.cuda_sm_count() // (m_blocks * split))


def main() -> int:
    split = int(os.environ.get("JAX_MLA_SM90_SPLIT", "1"))
    bad = ran = 0
    for case in test_gpu.CASES + test_gpu.LARGE_CASES:
        data, ref = test_gpu.prepared(case)
        parts = one_wave_parts(case, split)
        try:
            test_gpu.check(data, *test_gpu.run_gpu(data, kernel="auto"), ref=ref)
            with jax.default_device(test_gpu.gpu()):
                sched = jax_mla.decode_schedule(jax.device_put(data.seq_lens, test_gpu.gpu()),
                                                num_heads=case.h_q, seq_q=case.s_q, num_parts=parts)
            first = test_gpu.run_gpu(data, kernel="auto", schedule=sched)
            test_gpu.check(data, *first, ref=ref)
            again = test_gpu.run_gpu(data, kernel="auto", schedule=sched)
            for a, b in zip(first, again):
                np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8), err_msg="not bit-identical")
            print("ok  ", case.id, f"parts {parts}", flush=True)
        except AssertionError as e:
            bad += 1
            print("FAIL", case.id, f"parts {parts}", str(e)[:400], flush=True)
        ran += 1
    stats = jax_mla._ext.cuda_call_stats()
    info = jax_mla.kernel_info()
    on_sm90 = tuple(info.get("compute_capability") or ()) == (9, 0) and info.get("kernel") == "sm90"
    if on_sm90 and split > 1 and not stats.get("sm90_split_launches"):
        bad += 1
        print(f"FAIL JAX_MLA_SM90_SPLIT={split} but no split launch: {stats}", flush=True)
    print(f"launches: {stats}", flush=True)
    print(f"{ran} cases, {bad} failed", flush=True)
    return 1 if bad or not ran else 0


if __name__ == "__main__":
    sys.exit(main())
