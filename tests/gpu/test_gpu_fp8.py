"""mla_decode over an FP8 cache (uint8 rows of 656 bytes) on a GPU: the SM90 kernel (on 9.0), the SM100
kernel (on 10.0 / 10.3; "auto" takes it after its self-check, which covers the FP8 cache) and the
portable kernel (on every GPU) read it.

Every test here is marked `gpu` (skipped without a GPU, a failure with JAX_MLA_REQUIRE_GPU=1):

    JAX_MLA_REQUIRE_GPU=1 python3 -P -m pytest -q -m gpu tests/gpu/test_gpu_fp8.py

What is checked:
  - against float64 on the dequantized cache (cases.make_fp8 / cases.brute_force) with the GPU
    kernels' tolerance (relative L2 1e-2 for out, 1e-3 for lse: P is rounded to 16 bits for P V),
    for kernel="auto" (SM90 on 9.0, SM100 on 10.x once its self-check passed, else portable) and
    every kernel that reads the format on this device (READERS);
  - bit for bit, per reader, against the same kernel over unpack_fp8_kv(cache, q's dtype): each
    dequantizes into q's dtype in shared memory exactly as unpack_fp8_kv does, then runs the
    16-bit path's tensor-core, softmax and epilogue code unchanged;
  - the kernels that do not read the format refuse it with an error naming them, at trace time
    (kernel=) and in the handler (JAX_MLA_KERNEL);
  - schedules, NaN for a request reading an invalid page, the quantizing cache update in place.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cases
import jax_mla

pytestmark = pytest.mark.gpu
needs_reader = pytest.mark.skipif(not cases.gpu_fp8_reader(), reason=cases.NO_GPU_FP8_READER)

PAGE_SIZES = (16, 32, 64, 128, 256)


def fp8_readers() -> list[str]:
    """The kernels that read the FP8 cache and run on this device (SM90: compute capability 9.0;
    SM100: 10.0 or 10.3, when this build has it)."""
    readers = set(jax_mla._validate.FP8_KERNELS)
    try:
        cc = jax.devices("gpu")[0].compute_capability
    except RuntimeError:  # no GPU: the tests are skipped, the ids stay
        cc = None
    sm100_cubin = {"10.0": "sm100", "10.3": "sm103"}.get(cc)  # the build's name of the cubin it needs
    runs = {"sm90": cc == "9.0", "sm100": sm100_cubin in jax_mla._extension.ext.built_kernels(), "portable": True}
    return [k for k in ("sm90", "sm100", "portable") if k in readers and runs[k]]


READERS = fp8_readers()
NON_READERS = [k for k in ("sm90", "sm100") if k not in jax_mla._validate.FP8_KERNELS]


def edge_cases() -> list[cases.Case]:
    out = []
    seed = 36500
    for page in PAGE_SIZES:  # page boundaries +-1 and odd lengths on each page size
        for causal in (False, True):
            seed += 1
            out.append(cases.Case(lens=(0, 1, page - 1, page, page + 1, 3, 0, 2 * page + 7), s_q=3,
                                  h_q=3, page_size=page, causal=causal, seed=seed))
    for s_q in range(1, 9):
        seed += 1
        out.append(cases.Case(lens=(s_q - 1, s_q, 77, 0, 130), s_q=s_q, h_q=16, page_size=32,
                              causal=True, dtype=("bfloat16", "float16")[s_q % 2], seed=seed))
    for h_q in (1, 16, 64, 128):
        for dtype in ("bfloat16", "float16"):
            seed += 1
            out.append(cases.Case(lens=(1, 257, 1000), s_q=2 if h_q <= 64 else 1, h_q=h_q,
                                  page_size=64, dtype=dtype, seed=seed))
    out += [
        cases.Case(lens=(0, 0, 0), s_q=8, h_q=16, causal=True, seed=36600),
        cases.Case(lens=(2,), s_q=8, h_q=128, causal=True, page_size=16, seed=36601),
        cases.Case(lens=(300, 5), s_q=8, h_q=128, page_size=64, causal=True, seed=36602),  # 1024 rows
        cases.Case(lens=(77, 64, 300), h_q=16, page_size=16, rank4_cache=True, seed=36603),
        cases.Case(lens=(100,), h_q=128, softmax_scale=0.3, q_std=2.0, seed=36604),
    ]
    return out


CASES = edge_cases() + cases.random_sweep(int(os.environ.get("JAX_MLA_GPU_SWEEP", "24")), master_seed=37,
                                          page_sizes=PAGE_SIZES, max_s_q=8, budget=4_000_000)
LARGE = [
    cases.Case(lens=(4096,) * 32, h_q=128, page_size=64, extra_pages=8, seed=36700),
    cases.Case(lens=(8192,) * 16, h_q=16, page_size=256, extra_pages=8, seed=36701),
    cases.Case(lens=(32768,), h_q=128, page_size=64, seed=36702),
    cases.Case(lens=(2048,) * 8, s_q=4, h_q=128, page_size=128, causal=True, dtype="float16", seed=36703),
]


def gpu():
    return jax.devices("gpu")[0]


def run_gpu(data, kv_cache=None, **overrides):
    kw = dict(softmax_scale=data.case.softmax_scale, causal=data.case.causal, return_lse=True)
    kw.update(overrides)
    kv = data.kv_cache if kv_cache is None else kv_cache
    args = [jax.device_put(x, gpu()) for x in (data.q, kv, data.block_table, data.seq_lens)]
    with jax.default_device(gpu()):
        out, lse = jax_mla.mla_decode(*args, **kw)
    return np.asarray(out), np.asarray(lse)


def dequantized(data):
    """unpack_fp8_kv(cache, q's dtype), computed on the CPU."""
    with jax.default_device(jax.devices("cpu")[0]):
        return np.asarray(jax_mla.unpack_fp8_kv(data.kv_cache, cases.DTYPES[data.case.dtype]))


@functools.lru_cache(maxsize=1)
def prepared(case):
    data = cases.make_fp8(case)
    return data, cases.brute_force(data)


def check(data, out, lse, ref):
    case = data.case
    assert out.shape == (case.b, case.s_q, case.h_q, 512) and out.dtype == np.dtype(case.dtype)
    assert lse.shape == (case.b, case.s_q, case.h_q) and lse.dtype == np.float32
    cases.assert_close_rel_l2(out, lse, *ref, out_tol=1e-2, lse_tol=1e-3)


@needs_reader
@pytest.mark.parametrize("kernel", ["auto"] + READERS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_fp8_matches_float64_on_the_dequantized_cache(case, kernel):
    data, ref = prepared(case)
    check(data, *run_gpu(data, kernel=kernel), ref)


@needs_reader
@pytest.mark.parametrize("case", LARGE, ids=lambda c: c.id)
def test_fp8_large(case):
    data, ref = prepared(case)
    check(data, *run_gpu(data), ref)


@needs_reader
@pytest.mark.parametrize("kernel", READERS)
@pytest.mark.parametrize("case", CASES[::3] + LARGE[:1], ids=lambda c: c.id)
def test_fp8_is_bit_identical_to_the_dequantized_16bit_cache(case, kernel):
    data = cases.make_fp8(case)
    fp8 = run_gpu(data, kernel=kernel)
    dense = run_gpu(data, kv_cache=dequantized(data), kernel=kernel)
    for a, b in zip(fp8, dense):
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


@needs_reader
def test_kernel_info_names_the_fp8_kernel():
    info = jax_mla.kernel_info()
    # What auto takes for a 16-bit cache when that reads FP8 (SM100 after a failed self-check: portable).
    assert info["fp8_kernel"] == (info["kernel"] if info["kernel"] in READERS else "portable"), info
    assert "portable" in jax_mla._validate.FP8_KERNELS


@pytest.mark.skipif(cases.gpu_fp8_reader(), reason="a CUDA kernel reads the FP8 cache in this build")
def test_auto_refuses_fp8_while_no_kernel_reads_it():
    """Until a CUDA kernel has run the format, a GPU call with an FP8 cache is an error naming the
    way out, never a run of unverified code."""
    data = cases.make_fp8(cases.Case(lens=(5, 70), h_q=16, page_size=64, seed=36801))
    with pytest.raises(ValueError, match="no kernel reads an FP8 kv_cache"):
        run_gpu(data, kernel="auto")


@pytest.mark.parametrize("kernel", NON_READERS)
def test_kernels_that_do_not_read_fp8_refuse_it(kernel):
    data = cases.make_fp8(cases.Case(lens=(5, 70), h_q=16, page_size=64, seed=36800))
    with pytest.raises(ValueError, match=f"kernel '{kernel}' does not read an FP8 kv_cache"):
        run_gpu(data, kernel=kernel)


def test_env_kernel_that_does_not_read_fp8_is_refused_by_the_handler(tmp_path):
    """JAX_MLA_KERNEL=sm100 picks the kernel in the handler, past the trace-time check: the handler
    refuses the FP8 cache there (that kernel does not read it, or not on this device), naming the
    kernel and the variable."""
    script = (
        "import jax, numpy as np, jax_mla\n"
        "kv = np.zeros((4, 64, 656), np.uint8)\n"
        "q = np.zeros((1, 1, 16, 576), jax.numpy.bfloat16)\n"
        "try:\n"
        "    jax.block_until_ready(jax_mla.mla_decode(q, kv, np.zeros((1, 2), np.int32), np.array([5], np.int32)))\n"
        "except Exception as e:\n"
        "    print('REFUSED', e)\n"
        "else:\n"
        "    print('RAN')\n")
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    env["JAX_MLA_KERNEL"] = "sm100"
    proc = subprocess.run([sys.executable, "-P", "-c", script], cwd=str(tmp_path), env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "REFUSED" in proc.stdout and "requested by JAX_MLA_KERNEL" in proc.stdout, proc.stdout
    assert "does not read the FP8 kv_cache" in proc.stdout or "needs compute capability" in proc.stdout, \
        proc.stdout


@needs_reader
def test_identical_calls_are_bit_identical():
    data = cases.make_fp8(cases.Case(lens=(3000, 17, 0, 640), s_q=2, h_q=64, causal=True, seed=36801))
    a, b = run_gpu(data), run_gpu(data)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.view(np.uint8), y.view(np.uint8))


@needs_reader
def test_precomputed_schedule_and_num_parts():
    data, ref = prepared(cases.Case(lens=(0, 1, 700, 64, 2000, 129, 3, 0), s_q=2, h_q=16,
                                    page_size=16, causal=True, seed=36802))
    sl = jax.device_put(data.seq_lens, gpu())
    in_op = run_gpu(data)
    with jax.default_device(gpu()):
        default = jax_mla.decode_schedule(sl, num_heads=16, seq_q=2)
    for x, y in zip(in_op, run_gpu(data, schedule=default)):
        np.testing.assert_array_equal(x, y)
    for parts in (1, 7, 132):
        with jax.default_device(gpu()):
            sched = jax_mla.decode_schedule(sl, num_heads=16, seq_q=2, num_parts=parts)
        check(data, *run_gpu(data, schedule=sched), ref)


@needs_reader
def test_invalid_page_makes_that_request_nan():
    data = cases.make_fp8(cases.Case(lens=(70, 70, 5), h_q=16, page_size=16, seed=36803))
    table = data.block_table.copy()
    table[1, 2] = data.kv_cache.shape[0] + 3  # request 1 reads 5 pages
    args = [jax.device_put(x, gpu()) for x in (data.q, data.kv_cache, table, data.seq_lens)]
    out, lse = jax.jit(lambda *a: jax_mla.mla_decode(*a, return_lse=True))(*args)
    out, lse = np.asarray(out, np.float32), np.asarray(lse)
    assert np.isnan(out[1]).all() and np.isnan(lse[1]).all()
    assert np.isfinite(out[[0, 2]]).all() and np.isfinite(lse[[0, 2]]).all()


@needs_reader
def test_vmap_over_fp8_caches():
    datas = [cases.make_fp8(cases.Case(lens=(9, 70), h_q=4, page_size=16, extra_pages=2, seed=36804 + i))
             for i in range(3)]
    num_pages = max(d.kv_cache.shape[0] for d in datas)
    width = max(d.block_table.shape[1] for d in datas)
    kv = np.stack([np.pad(d.kv_cache, [(0, num_pages - d.kv_cache.shape[0]), (0, 0), (0, 0)],
                          constant_values=0xFF) for d in datas])
    bt = np.stack([np.pad(d.block_table, [(0, 0), (0, width - d.block_table.shape[1])], constant_values=-1)
                   for d in datas])
    args = [jax.device_put(x, gpu()) for x in (np.stack([d.q for d in datas]), kv, bt,
                                               np.stack([d.seq_lens for d in datas]))]
    out, lse = jax.vmap(lambda *a: jax_mla.mla_decode(*a, return_lse=True))(*args)
    for i, d in enumerate(datas):
        check(d, np.asarray(out[i]), np.asarray(lse[i]), cases.brute_force(d))


@needs_reader
@pytest.mark.parametrize("new_dtype", [np.float32, jnp.bfloat16])
def test_update_kv_cache_quantizes_in_place_on_the_gpu(new_dtype):
    rng = np.random.default_rng(36805)
    kv_host = rng.integers(0, 256, size=(32, 16, 656), dtype=np.uint8)
    table = rng.permutation(32)[:8].astype(np.int32).reshape(2, 4)
    positions = np.array([[3, 15, 16, -1], [0, 40, 63, 7]], np.int32)
    new = (rng.standard_normal((2, 4, 576)) * rng.choice([1e-3, 1.0, 30.0], size=(2, 4, 1))).astype(new_dtype)
    with jax.default_device(jax.devices("cpu")[0]):
        rows = np.asarray(jax_mla.pack_fp8_kv(new))
    want = kv_host.copy()
    for r in range(2):
        for t in range(4):
            p = int(positions[r, t])
            if p >= 0:
                want[table[r, p // 16], p % 16] = rows[r, t]
    kv = jax.device_put(kv_host, gpu())
    ptr = kv.unsafe_buffer_pointer()
    step = jax.jit(jax_mla.update_kv_cache, donate_argnums=0)
    got = step(kv, *(jax.device_put(x, gpu()) for x in (new, table, positions)))
    assert kv.is_deleted() and got.unsafe_buffer_pointer() == ptr
    np.testing.assert_array_equal(np.asarray(got), want)  # the GPU quantizes as the CPU does
