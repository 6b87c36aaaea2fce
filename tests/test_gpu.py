"""The CUDA kernels (jax_mla.mla_decode on a GPU) against the fp32 reference computed on the CPU.

Every test here is marked `gpu`: skipped without a GPU, a failure instead when
JAX_MLA_REQUIRE_GPU=1. To add cases, append Case(...) objects to EXTRA_CASES or LARGE_CASES, or
set JAX_MLA_GPU_SWEEP=N for N random cases instead of the default number.

The kernel tests run twice: with kernel="auto" (the device's own kernel: sm90 on an H100/H200)
and with the portable kernel forced (kernel="portable"), which is how the portable kernel is tested
on Hopper. JAX_MLA_GPU_KERNELS=auto (or portable) runs one of them only.
"""

from __future__ import annotations

import functools
import os

import jax
import numpy as np
import pytest

import cases
import jax_mla
from jax_mla import _ext

pytestmark = pytest.mark.gpu

GPU_PAGE_SIZES = (16, 32, 64, 128, 256)
SWEEP = cases.random_sweep(int(os.environ.get("JAX_MLA_GPU_SWEEP", "48")), master_seed=3,
                           page_sizes=GPU_PAGE_SIZES, heads=(1, 3, 16, 64, 128), max_s_q=4,
                           budget=4_000_000)
EXTRA_CASES: list[cases.Case] = [
    cases.Case(lens=(300, 5), s_q=8, h_q=128, page_size=64, causal=True, seed=9001),  # rows = 1024
    cases.Case(lens=(0,) * 5 + (64,), h_q=16, page_size=16, seed=9002),
]
# Production-like shapes (DeepSeek-V3: 128 heads, or 16 per GPU at TP8).
LARGE_CASES: list[cases.Case] = [
    cases.Case(lens=(4096,) * 32, h_q=128, page_size=64, extra_pages=8, seed=9101),
    cases.Case(lens=(8192,) * 64, h_q=16, page_size=64, extra_pages=8, seed=9102),
    cases.Case(lens=(32768,), h_q=128, page_size=64, seed=9103),
    cases.Case(lens=(4096,) * 16, s_q=2, h_q=128, page_size=64, causal=True, seed=9104),
    cases.Case(lens=tuple(int(x) for x in np.random.default_rng(9105).integers(1, 9128, 64)),
               h_q=128, page_size=64, seed=9105),
    # The SM90 issue's larger cases: b = 256, a 128K context, s_q = 4 causal.
    cases.Case(lens=(1024,) * 256, h_q=16, page_size=64, extra_pages=8, seed=9106),
    cases.Case(lens=(131072,), h_q=128, page_size=256, seed=9107),
    cases.Case(lens=(2048,) * 8, s_q=4, h_q=128, page_size=128, causal=True, seed=9108),
]
CASES = cases.edge_cases(GPU_PAGE_SIZES) + SWEEP + EXTRA_CASES
KERNELS = tuple(os.environ.get("JAX_MLA_GPU_KERNELS", "auto,portable").split(","))


def gpu():
    return jax.devices("gpu")[0]


def cpu():
    return jax.devices("cpu")[0]


def run_gpu(data, **overrides):
    kw = dict(softmax_scale=data.case.softmax_scale, causal=data.case.causal, return_lse=True)
    kw.update(overrides)
    args = [jax.device_put(x, gpu()) for x in data.args]
    with jax.default_device(gpu()):
        out, lse = jax_mla.mla_decode(*args, **kw)
    assert out.devices() == {gpu()}
    return np.asarray(out), np.asarray(lse)


def reference_on_cpu(data, **overrides):
    with jax.default_device(cpu()):
        return cases.reference(data, **overrides)


@functools.lru_cache(maxsize=1)
def prepared(case):
    """The case's data and its CPU reference, kept for the next kernel's run of the same case
    (the kernel parameter varies fastest, so each case is built and referenced once)."""
    data = cases.make(case)
    return data, reference_on_cpu(data)


def check(data, out, lse, ref=None):
    case = data.case
    assert out.shape == (case.b, case.s_q, case.h_q, 512) and out.dtype == np.dtype(case.dtype)
    assert lse.shape == (case.b, case.s_q, case.h_q) and lse.dtype == np.float32
    cases.assert_close_rel_l2(out, lse, *(reference_on_cpu(data) if ref is None else ref), out_tol=1e-2,
                              lse_tol=1e-3)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_gpu_kernel_matches_reference(case, kernel):
    data, ref = prepared(case)
    check(data, *run_gpu(data, kernel=kernel), ref=ref)


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("case", LARGE_CASES, ids=lambda c: c.id)
def test_gpu_kernel_large(case, kernel):
    data, ref = prepared(case)
    check(data, *run_gpu(data, kernel=kernel), ref=ref)


def test_gpu_build_has_cuda():
    assert _ext.has_cuda(), "jax sees a GPU but jax_mla._ext was built without CUDA"
    assert "CUDA" in _ext.registrations()
    assert _ext.cuda_sm_count() > 0


@pytest.mark.parametrize("kernel", KERNELS)
def test_identical_calls_are_bit_identical(kernel):
    data = cases.make(cases.Case(lens=(3000, 17, 0, 640), s_q=2, h_q=64, causal=True, seed=9201))
    a = run_gpu(data, kernel=kernel)
    b = run_gpu(data, kernel=kernel)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.view(np.uint8), y.view(np.uint8))


@pytest.mark.parametrize("kernel", KERNELS)
def test_precomputed_schedule_and_num_parts(kernel):
    data = cases.make(cases.Case(lens=(0, 1, 700, 64, 2000, 129, 3, 0), s_q=2, h_q=16,
                                 page_size=16, causal=True, seed=9202))
    sl = jax.device_put(data.seq_lens, gpu())
    in_op = run_gpu(data, kernel=kernel)
    with jax.default_device(gpu()):
        default = jax_mla.decode_schedule(sl, num_heads=16, seq_q=2)
    # The device scheduler builds exactly the host plan.
    num_parts = (default.shape[0] - data.case.b - 1) // 8
    np.testing.assert_array_equal(np.asarray(default), _ext.plan_schedule(data.seq_lens, num_parts))
    with_default = run_gpu(data, schedule=default, kernel=kernel)
    for x, y in zip(in_op, with_default):
        np.testing.assert_array_equal(x, y)
    for parts in (1, 7, 132):
        with jax.default_device(gpu()):
            sched = jax_mla.decode_schedule(sl, num_heads=16, seq_q=2, num_parts=parts)
        np.testing.assert_array_equal(np.asarray(sched), _ext.plan_schedule(data.seq_lens, parts))
        check(data, *run_gpu(data, schedule=sched, kernel=kernel))


@pytest.mark.parametrize("page", [8, 48])
def test_unsupported_page_size_is_a_clear_error(page):
    data = cases.make(cases.Case(lens=(100, 3), h_q=16, page_size=page, seed=9203))
    with pytest.raises(ValueError, match="power-of-two page_size"):
        run_gpu(data)


@pytest.mark.parametrize("kernel", KERNELS)
def test_jit_and_vmap_on_gpu(kernel):
    base = cases.Case(lens=(0, 5, 130, 64), s_q=2, h_q=16, page_size=16, causal=True, seed=9204)
    datas = [cases.make(base.replace(seed=9204 + v)) for v in range(3)]
    stacked = [jax.device_put(np.stack(xs), gpu()) for xs in zip(*(d.args for d in datas))]
    fn = jax.jit(jax.vmap(lambda *a: jax_mla.mla_decode(*a, causal=True, return_lse=True, kernel=kernel)))
    out, lse = fn(*stacked)
    for v, d in enumerate(datas):
        check(d, np.asarray(out[v]), np.asarray(lse[v]))


@pytest.mark.parametrize("kernel", KERNELS)
def test_bad_page_ids_and_lengths_give_nan_for_that_request_only(kernel):
    """On the GPU the block table is only read on the device: a page id outside the cache, or a
    length the table cannot hold (seen only at run time under jit), makes that request's output and
    LSE NaN instead of reading memory it must not. Other requests are unaffected."""
    data = cases.make(cases.Case(lens=(300, 200, 100), h_q=16, page_size=64, seed=9301))
    q, kv, bt, sl = (np.array(x) for x in data.args)
    num_pages = kv.shape[0]
    bt[1, 2] = num_pages + 5          # request 1 reads its 3rd page: out of range
    sl_bad = sl.copy()
    sl_bad[2] = bt.shape[1] * 64 + 1  # request 2: longer than its block-table row holds
    fn = jax.jit(lambda *a: jax_mla.mla_decode(*a, return_lse=True, kernel=kernel))
    out, lse = (np.asarray(x) for x in fn(*[jax.device_put(x, gpu()) for x in (q, kv, bt, sl_bad)]))
    assert np.isnan(out[1].astype(np.float32)).all() and np.isnan(lse[1]).all()
    assert np.isnan(out[2].astype(np.float32)).all() and np.isnan(lse[2]).all()
    ref_out, ref_lse = reference_on_cpu(data)
    cases.assert_close_rel_l2(out[:1], lse[:1], np.asarray(ref_out)[:1], np.asarray(ref_lse)[:1],
                              out_tol=1e-2, lse_tol=1e-3)
