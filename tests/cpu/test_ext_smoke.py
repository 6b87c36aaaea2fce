"""Smoke tests of the extension module jax_mla._ext and its CPU FFI handlers, called directly
through jax.ffi.ffi_call (below the Python API): module surface, registration format, the
buffer/attribute contract of docs/design.md, run-time errors, and both CPU code paths."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_mla  # noqa: F401  (registers the FFI targets)
from jax_mla import _ext

NO_SCHEDULE = np.zeros((0,), np.int32)


def ffi_decode(q, kv_cache, block_table, seq_lens, schedule=NO_SCHEDULE, *, softmax_scale=576**-0.5,
               causal=False, num_parts=4, kernel=0, chunk_blocks=0):
    b, s_q, h_q, _ = q.shape
    results = (jax.ShapeDtypeStruct((b, s_q, h_q, 512), q.dtype), jax.ShapeDtypeStruct((b, s_q, h_q), jnp.float32))
    out, lse = jax.ffi.ffi_call("jax_mla_decode", results)(
        q, kv_cache, block_table, seq_lens, schedule,
        softmax_scale=np.float32(softmax_scale), causal=bool(causal), num_parts=np.int32(num_parts),
        kernel=np.int32(kernel), chunk_blocks=np.int32(chunk_blocks))
    return np.asarray(out), np.asarray(lse)


def ffi_schedule(seq_lens, num_parts):
    size = _ext.testing.schedule_size(seq_lens.shape[0], num_parts)
    call = jax.ffi.ffi_call("jax_mla_decode_schedule", jax.ShapeDtypeStruct((size,), jnp.int32))
    return np.asarray(call(seq_lens, num_parts=np.int32(num_parts), chunk_blocks=np.int32(0)))


def reference(q, kv_cache, block_table, seq_lens, scale, causal):
    """float64 brute force of docs/design.md "Semantics"."""
    b, s_q, h_q, _ = q.shape
    page = kv_cache.shape[1]
    q64, kv64 = q.astype(np.float64), kv_cache.astype(np.float64)
    out, lse = np.zeros((b, s_q, h_q, 512)), np.full((b, s_q, h_q), -np.inf)
    for r in range(b):
        n = int(seq_lens[r])
        j = np.arange(n)
        keys = kv64[block_table[r, j // page], j % page]  # (n, 576)
        for t in range(s_q):
            visible = max(0, n - s_q + t + 1) if causal else n
            if visible == 0:
                continue
            s = scale * q64[r, t] @ keys[:visible].T  # (h_q, visible)
            m = s.max(-1, keepdims=True)
            p = np.exp(s - m)
            z = p.sum(-1, keepdims=True)
            out[r, t] = p @ keys[:visible, :512] / z
            lse[r, t] = (m + np.log(z))[:, 0]
    return out, lse


def make_inputs(seed, b, s_q, h_q, page, seq_lens, dtype):
    rng = np.random.default_rng(seed)
    max_pages = max(1, max(-(-n // page) for n in seq_lens))
    num_pages = b * max_pages + 2
    q = rng.standard_normal((b, s_q, h_q, 576)).astype(dtype)
    kv = rng.standard_normal((num_pages, page, 576)).astype(dtype)
    table = rng.permutation(num_pages)[: b * max_pages].reshape(b, max_pages).astype(np.int32)
    return q, kv, table, np.asarray(seq_lens, np.int32)


def test_module_surface():
    limits = _ext.limits()
    assert [limits[k] for k in ("HEAD_DIM_QK", "HEAD_DIM_V", "BLOCK_M", "BLOCK_N")] == [576, 512, 64, 64]
    assert (limits["MAX_SEQ_Q"], limits["MAX_HEADS_Q"]) == (8, 128)
    # What only tests and benchmarks use is in the private submodule, not the module itself.
    for name in ("plan_schedule", "schedule_size", "select_kernel", "auto_candidate", "cuda_call_stats",
                 "parse_settings"):
        assert hasattr(_ext.testing, name) and not hasattr(_ext, name), name
    assert isinstance(_ext.has_cuda(), bool)
    assert _ext.cuda_sm_count() >= 0
    if not _ext.has_cuda():
        assert _ext.cuda_sm_count() == 0


def test_registrations_format():
    regs = _ext.registrations()
    assert set(regs["cpu"]) == {"jax_mla_decode", "jax_mla_decode_schedule", "jax_mla_decode_sparse"}
    capsule_type = type(regs["cpu"]["jax_mla_decode"])
    assert capsule_type.__name__ == "PyCapsule"
    if _ext.has_cuda():
        cuda = regs["CUDA"]
        # Multi-stage handlers: the shared initialize stage caches device properties.
        assert set(cuda) == {"jax_mla_decode", "jax_mla_decode_schedule", "jax_mla_decode_sparse"}
        for target in cuda:
            assert set(cuda[target]) == {"initialize", "execute"}
            assert all(type(c) is capsule_type for c in cuda[target].values())
    else:
        assert set(regs) == {"cpu"}


def test_sizes():
    # parts, split_offsets (b + 1), combine list header (2) and entries (b).
    assert _ext.testing.schedule_size(3, 5) == 5 * 8 + (3 + 1) + 2 + 3
    # schedule, then partial lse (max_splits = b + parts slots, 256-byte aligned), then partial out,
    # then the SM90 split merge's arrival counters: (b, ceil(rows / 64)) int32.
    b, rows, parts = 3, 32, 5
    lse_offset = -(-_ext.testing.schedule_size(b, parts) * 4 // 256) * 256
    out_offset = lse_offset + -(-(b + parts) * rows * 4 // 256) * 256
    counters_offset = out_offset + (b + parts) * rows * 512 * 4
    assert _ext.workspace_bytes(b, rows, parts) == counters_offset + b * 1 * 4
    rows = 130  # three row blocks
    lse_offset = -(-_ext.testing.schedule_size(2, parts) * 4 // 256) * 256
    out_offset = lse_offset + -(-(2 + parts) * rows * 4 // 256) * 256
    assert _ext.workspace_bytes(2, rows, parts) == out_offset + (2 + parts) * rows * 512 * 4 + 2 * 3 * 4
    # The sparse call's (common/workspace.h): the dense decode's over queries = b * s_q requests of
    # h_q rows, then the compacted block table (queries, topk) and lengths (queries), int32, each
    # 256-byte aligned.
    queries, h_q, topk = 6, 33, 100
    table_offset = -(-_ext.workspace_bytes(queries, h_q, parts) // 256) * 256
    lengths_offset = -(-(table_offset + queries * topk * 4) // 256) * 256
    assert _ext.sparse_workspace_bytes(queries, h_q, topk, parts) == lengths_offset + queries * 4
    with pytest.raises(ValueError):
        _ext.sparse_workspace_bytes(queries, h_q, 0, parts)
    with pytest.raises(ValueError):
        _ext.testing.schedule_size(3, 0)
    with pytest.raises(ValueError):
        _ext.testing.plan_schedule(np.array([1, 2], np.int32), 0)


def test_plan_schedule_matches_ffi_target():
    seq_lens = np.array([0, 1, 64, 65, 5000, 3, 0, 777], np.int32)
    for parts in (1, 2, 7, 132):
        host = _ext.testing.plan_schedule(seq_lens, parts)
        assert host.dtype == np.int32 and host.shape == (_ext.testing.schedule_size(8, parts),)
        np.testing.assert_array_equal(ffi_schedule(seq_lens, parts), host)
    # Other integer arrays are converted.
    plan = _ext.testing.plan_schedule
    np.testing.assert_array_equal(plan(seq_lens.astype(np.int64), 7), plan(seq_lens, 7))


@pytest.mark.parametrize(
    "b, s_q, h_q, page, seq_lens, dtype, causal, num_parts, pass_schedule",
    [
        (1, 1, 16, 64, [200], ml_dtypes.bfloat16, False, 1, False),
        (3, 2, 16, 16, [0, 70, 513], ml_dtypes.bfloat16, True, 4, True),
        (4, 1, 128, 1, [1, 64, 65, 300], np.float16, False, 7, True),
        (2, 8, 16, 100, [5, 1000], ml_dtypes.bfloat16, True, 17, False),  # causal with s_q > seq_len
        (3, 3, 70, 256, [1500, 0, 130], np.float16, True, 33, False),  # 210 rows: partial m-block
    ],
)
def test_decode_matches_float64(b, s_q, h_q, page, seq_lens, dtype, causal, num_parts, pass_schedule):
    q, kv, table, lens = make_inputs(0, b, s_q, h_q, page, seq_lens, dtype)
    schedule = _ext.testing.plan_schedule(lens, num_parts) if pass_schedule else NO_SCHEDULE
    out, lse = ffi_decode(q, kv, table, lens, schedule, causal=causal, num_parts=num_parts)
    ref_out, ref_lse = reference(q, kv, table, lens, 576**-0.5, causal)
    assert out.dtype == dtype and lse.dtype == np.float32
    tol = 1e-2 if dtype == ml_dtypes.bfloat16 else 2e-3  # one rounding of the output
    np.testing.assert_allclose(out.astype(np.float64), ref_out, atol=tol * max(1.0, np.abs(ref_out).max()))
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5, atol=1e-5)  # -inf rows must match exactly
    assert (out[np.isinf(ref_lse)].astype(np.float32) == 0).all()


def test_masked_nan_does_not_leak():
    q, kv, table, lens = make_inputs(1, 1, 2, 16, 16, [40], ml_dtypes.bfloat16)
    kv[table[0, 39 // 16], 39 % 16] = np.nan  # token 39: hidden from query token 0 (causal)
    kv[table[0, 45 // 16], 45 % 16] = np.nan  # token 45: past seq_len
    out, _ = ffi_decode(q, kv, table, lens, causal=True, num_parts=1)
    out = out.astype(np.float32)
    assert not np.isnan(out[0, 0]).any()
    assert np.isnan(out[0, 1]).all()  # token 1 sees the NaN key


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: a.update(seq_lens=np.array([100, 900], np.int32)),
         "seq_lens[1] = 900 exceeds block_table capacity 2 pages x 256 = 512"),
        (lambda a: a.update(seq_lens=np.array([-1, 5], np.int32)), "seq_lens[0] = -1 is negative"),
        (lambda a: a["block_table"].__setitem__((1, 1), 99), "block_table[1, 1] = 99 is not a page of kv_cache"),
        (lambda a: a.update(schedule=_ext.testing.plan_schedule(np.array([300, 100], np.int32), 4)),
         "schedule does not match seq_lens"),
        (lambda a: a.update(schedule=np.zeros(3, np.int32)), "schedule must have shape (0,) or (schedule_size(b=2"),
        (lambda a: a.update(num_parts=0), "num_parts must be >= 1"),
        (lambda a: a.update(softmax_scale=-0.125), "softmax_scale must be positive and finite, got -0.125"),
        (lambda a: a.update(softmax_scale=0.0), "softmax_scale must be positive and finite, got 0"),
        (lambda a: a.update(softmax_scale=np.inf), "softmax_scale must be positive and finite, got inf"),
        (lambda a: a.update(kernel=4),
         "kernel must be one of 'auto', 'sm90', 'sm100', 'portable' (attribute values 0 to 3), got 4"),
        (lambda a: a.update(kernel=-1), "(attribute values 0 to 3), got -1"),
        (lambda a: a.update(kv_cache=a["kv_cache"].astype(np.float16)), "kv_cache dtype float16 differs from q"),
        (lambda a: a.update(block_table=a["block_table"][:1]), "block_table must have shape (b, max_pages)"),
    ],
)
def test_runtime_errors(change, message):
    q, kv, table, lens = make_inputs(2, 2, 1, 16, 256, [100, 300], ml_dtypes.bfloat16)
    args = dict(q=q, kv_cache=kv, block_table=table, seq_lens=lens, schedule=NO_SCHEDULE, num_parts=4, kernel=0)
    change(args)
    attrs = dict(num_parts=args.pop("num_parts"), kernel=args.pop("kernel"))
    if "softmax_scale" in args:
        attrs["softmax_scale"] = args.pop("softmax_scale")
    with pytest.raises(Exception, match="jax_mla_decode: ") as info:
        ffi_decode(**args, **attrs)
    assert message in str(info.value)


@pytest.mark.parametrize("kernel", sorted(_ext.KERNELS.values()))
def test_cpu_handler_accepts_and_ignores_every_kernel(kernel):
    q, kv, table, lens = make_inputs(5, 2, 2, 16, 64, [100, 3], ml_dtypes.bfloat16)
    want = ffi_decode(q, kv, table, lens, causal=True)
    got = ffi_decode(q, kv, table, lens, causal=True, kernel=kernel)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_unread_block_table_entries_are_ignored():
    q, kv, table, lens = make_inputs(3, 2, 1, 16, 256, [100, 300], ml_dtypes.bfloat16)
    table[0, 1] = -7  # request 0 reads only its first page
    ffi_decode(q, kv, table, lens)


_GENERIC_SCRIPT = """
import sys, numpy as np, jax_mla, test_ext_smoke as t
q, kv, table, lens = t.make_inputs(4, 3, 2, 40, 64, [700, 5, 130], np.float16)
out, lse = t.ffi_decode(q, kv, table, lens, causal=True, num_parts=5)
np.save(sys.argv[1], out.astype(np.float32)); np.save(sys.argv[2], lse)
"""


def test_generic_and_default_cpu_paths_agree(tmp_path):
    """JAX_MLA_CPU_ISA=generic forces the baseline block products (the default may be AVX2)."""
    results = []
    for isa in ("", "generic"):
        env = dict(os.environ, JAX_MLA_CPU_ISA=isa)
        files = [str(tmp_path / f"{isa or 'default'}_{n}.npy") for n in ("out", "lse")]
        subprocess.run([sys.executable, "-c", _GENERIC_SCRIPT, *files], check=True, env=env,
                       cwd=os.path.dirname(__file__))
        results.append([np.load(f) for f in files])
    (out_a, lse_a), (out_b, lse_b) = results
    np.testing.assert_allclose(out_a, out_b, atol=2e-3)
    np.testing.assert_allclose(lse_a, lse_b, rtol=1e-5, atol=1e-5)
