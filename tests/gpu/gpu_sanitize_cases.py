"""A few small GPU cases run as a plain script: the smoke test of benchmarks/device_run.sh and the
program compute-sanitizer (memcheck, racecheck) runs. Not collected by pytest (no test_ prefix).
Each case runs with kernel="auto" and with the portable kernel forced, the FP8 cases (uint8 rows of
656 bytes, cases.make_fp8) too (auto takes the SM90 kernel for them on 9.0). The sparse cases
(mla_decode_sparse: index compaction, the portable kernel over one-token pages, the sink) run under
jit with one out-of-range index, which must give NaN for its query token without an out-of-bounds
read. Exits non-zero when a result differs from the reference."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
# cases.py is in tests/, one folder up.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

import cases  # noqa: E402
import jax_mla  # noqa: E402

SMALL = [
    # odd tile count, partial last page, two requests split over parts
    cases.Case(lens=(200, 3), h_q=16, page_size=64, seed=1),
    # s_q > 1 causal, 128 rows (two row blocks), small pages, an empty request
    cases.Case(lens=(130, 0, 64), s_q=2, h_q=64, page_size=16, causal=True, seed=2),
    # many parts per request (combine), big pages
    cases.Case(lens=(1000,), h_q=128, page_size=256, seed=3),
    # every class of the combine list in one call: ~47 splits (one CTA per row slice, shared-memory
    # reduction), 2 splits (one warp per row), empty
    cases.Case(lens=(3000, 0, 70), s_q=2, h_q=16, page_size=64, causal=True, seed=4),
    # 16 rows from s_q = 2 x h_q = 8 (rows 16-63 of the row block past the request's), causal, small pages
    cases.Case(lens=(700, 33), s_q=2, h_q=8, page_size=32, causal=True, seed=5),
    # b16/1K-like: the auto split plan takes pieces (4 equal pieces per request, scheduler.h)
    cases.Case(lens=(1024,) * 16, h_q=128, page_size=64, seed=6),
]

# FP8 caches: each page size's raw-row copies (656-byte rows), NaN-poisoned unused pages and scales,
# s_q = 8 causal, split requests.
SMALL_FP8 = [
    cases.Case(lens=(200, 3, 0), h_q=16, page_size=16, seed=11),
    cases.Case(lens=(130, 33), s_q=8, h_q=16, page_size=32, causal=True, dtype="float16", seed=12),
    cases.Case(lens=(1000, 64), h_q=128, page_size=256, seed=13),
    cases.Case(lens=(700, 129), s_q=2, h_q=64, page_size=128, causal=True, seed=14),
]

# mla_decode_sparse: few splits per token (topk_length partial, sink, duplicates and -1), many
# splits (one token of 2048 indices), an odd h_q over a cache of 3-token pages; each also over an
# FP8 cache when the portable kernel reads it.
SPARSE = [
    dict(seed=21, b=2, s_q=2, h_q=16, topk=300, page_size=16, num_pages=40),
    dict(seed=22, b=1, s_q=1, h_q=128, topk=2048, page_size=64, num_pages=64),
    dict(seed=23, b=3, s_q=1, h_q=33, topk=7, page_size=3, num_pages=12),
]

# The device scheduler on its three CTA shapes (b <= 128, <= 1024, more), with few non-empty
# requests so that the pieces plan's search (barriers per step in the larger shapes) runs: its array
# must equal the host planner's.
SCHEDULE_BATCHES = (5, 300, 2000)


def run_sparse(gpu, spec, fp8) -> bool:
    """One jitted sparse call with topk_length, a sink and an out-of-range index in its last query
    token: that token NaN, the others within the GPU tolerance of float64."""
    with jax.default_device(jax.devices("cpu")[0]):
        q, kv, idx, rows64 = cases.make_sparse(**spec, fp8=fp8)
    b, s_q, h_q, topk = spec["b"], spec["s_q"], spec["h_q"], spec["topk"]
    tl = np.full(b, topk, np.int32)
    tl[0] = topk * 2 // 3
    sink = np.linspace(-2, 2, h_q).astype(np.float32)
    bad_idx = idx.copy()
    bad_idx[-1, -1, 1] = kv.shape[0] * kv.shape[1] + 3  # request b - 1 counts all its indices
    fn = jax.jit(lambda *a: jax_mla.mla_decode_sparse(*a[:3], topk_length=a[3], attn_sink=a[4], return_lse=True))
    out, lse = (np.asarray(x) for x in fn(*[jax.device_put(x, gpu) for x in (q, kv, bad_idx, tl, sink)]))
    ref_out, ref_lse = cases.sparse_brute_force(q, rows64, idx, tl, sink=sink)
    keep = np.ones((b, s_q), bool)
    keep[-1, -1] = False
    name = f"sparse b{b} s_q{s_q} h{h_q} topk{topk} page{spec['page_size']}{' fp8' if fp8 else ''}"
    try:
        assert np.isnan(out[-1, -1].astype(np.float32)).all() and np.isnan(lse[-1, -1]).all(), "no NaN"
        if keep.any():
            cases.assert_close_rel_l2(out[keep], lse[keep], ref_out[keep], ref_lse[keep], out_tol=1e-2, lse_tol=1e-3)
        print("ok  ", name, flush=True)
        return True
    except AssertionError as e:
        print("FAIL", name, str(e)[:400], flush=True)
        return False


def main() -> int:
    gpu = jax.devices("gpu")[0]
    bad = 0
    runs = [(c, cases.make, ("auto", "portable")) for c in SMALL]
    if cases.gpu_fp8_reader():  # else a GPU call with an FP8 cache is refused (kernel_select.h)
        runs += [(c, cases.make_fp8, ("auto", "portable")) for c in SMALL_FP8]
    for case, make, kernels in runs:
        data = make(case)
        args = [jax.device_put(x, gpu) for x in data.args]
        with jax.default_device(jax.devices("cpu")[0]):
            ref_out, ref_lse = cases.reference(data)
        for kernel in kernels:
            out, lse = jax_mla.mla_decode(*args, causal=case.causal, return_lse=True, kernel=kernel)
            out, lse = np.asarray(out), np.asarray(lse)
            try:
                cases.assert_close_rel_l2(out, lse, ref_out, ref_lse, out_tol=1e-2, lse_tol=1e-3)
                print("ok  ", kernel, case.id, data.kv_cache.dtype, flush=True)
            except AssertionError as e:
                bad += 1
                print("FAIL", kernel, case.id, data.kv_cache.dtype, str(e)[:400], flush=True)
    for fp8 in (False, True) if "portable" in jax_mla._validate.FP8_KERNELS else (False,):
        for spec in SPARSE:
            bad += not run_sparse(gpu, spec, fp8)
    rng = np.random.default_rng(7)
    for b in SCHEDULE_BATCHES:
        lens = np.where(rng.permutation(b) < 5, rng.choice([1, 64, 1000, 5000, 40000], b), 0).astype(np.int32)
        with jax.default_device(gpu):
            sched = np.asarray(jax_mla.decode_schedule(jax.device_put(lens, gpu), num_heads=16, num_parts=66))
        same = np.array_equal(sched, jax_mla._ext.testing.plan_schedule(lens, 66))
        bad += not same
        print("ok  " if same else "FAIL", f"schedule b={b}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
