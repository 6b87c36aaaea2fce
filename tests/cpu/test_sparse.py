"""mla_decode_sparse on the CPU kernel against a float64 NumPy reference on the gathered rows
(cases.make_sparse, cases.sparse_brute_force; tests/gpu/test_gpu_sparse.py uses them too).

Every case draws fresh random data. Pages no index selects are poisoned (NaN for a 16-bit cache,
fp8_poison_rows / 0xFF bytes for an FP8 one), so a kernel reading an unselected slot fails
check_structure. Bound: as mla_decode's (cases.assert_close_rounding_only): the kernel's only errors
are fp32 accumulation and the final rounding to q's dtype.
"""

from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cases
import jax_mla

pytestmark = pytest.mark.usefixtures("on_cpu")

def check(q, kv, idx, rows64, dtype, topk_length=None, sink=None, scale=None, jit=False):
    kw = dict(topk_length=topk_length, attn_sink=sink, softmax_scale=scale, return_lse=True)
    fn = jax.jit(lambda *a: jax_mla.mla_decode_sparse(*a, **kw)) if jit else (
        lambda *a: jax_mla.mla_decode_sparse(*a, **kw))
    out, lse = fn(q, kv, idx)
    assert out.dtype == q.dtype and out.shape == q.shape[:3] + (512,) and lse.dtype == np.float32
    ref_out, ref_lse = cases.sparse_brute_force(q, rows64, idx, topk_length, 576 ** -0.5 if scale is None else scale,
                                                sink)
    score_mag = float(np.abs(ref_lse[np.isfinite(ref_lse)]).max(initial=1.0)) * 4
    value_mag = float(np.nanmax(np.abs(rows64[np.isfinite(rows64).all(1)])))
    cases.assert_close_rounding_only(out, lse, ref_out, ref_lse, dtype, score_mag, value_mag=value_mag)
    # The plain-jnp reference agrees too (an independent implementation).
    j_out, j_lse = jax_mla.reference.mla_decode_sparse_reference(
        q, kv, idx, topk_length=topk_length, attn_sink=sink, softmax_scale=scale, out_dtype=jnp.float32)
    np.testing.assert_allclose(np.asarray(j_out, np.float64), ref_out, atol=1e-4 * max(value_mag, 1.0), rtol=1e-4)
    np.testing.assert_allclose(np.asarray(j_lse, np.float64), ref_lse, atol=1e-4, rtol=1e-5)
    return out, lse


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16cache", "fp8cache"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("page_size", [16, 64, 256, 37])
def test_random(dtype, fp8, page_size):
    for i, (s_q, h_q, topk) in enumerate([(1, 16, 7), (2, 64, 64), (4, 128, 1), (3, 16, 2048)]):
        seed = zlib.crc32(repr((dtype, fp8, page_size, i)).encode())
        num_pages = max(4, -(-2 * topk // page_size) + 2)
        data = cases.make_sparse(seed, s_q=s_q, h_q=h_q, topk=topk, page_size=page_size, num_pages=num_pages,
                    dtype=dtype, fp8=fp8, b=2 if h_q < 128 else 1)
        check(*data, dtype)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16cache", "fp8cache"])
def test_adversarial_indices(fp8):
    q, kv, idx, rows64 = cases.make_sparse(1, b=3, s_q=2, topk=64, fp8=fp8)
    idx[0] = -1                         # request 0: no valid index at all -> out 0, lse -inf
    idx[1, 0, :] = 5                    # every index the same slot (64 duplicates)
    idx[1, 1, ::2] = -1                 # half skipped
    out, lse = check(q, kv, idx, rows64, "bfloat16")
    assert (np.asarray(out[0], np.float32) == 0).all() and np.isneginf(np.asarray(lse[0])).all()
    # 64 copies of one slot: softmax weight 1 on it, lse = score + log 64.
    s = np.asarray(q[1, 0], np.float64) @ rows64[idx[1, 0, 0]] * 576 ** -0.5
    np.testing.assert_allclose(np.asarray(lse[1, 0], np.float64), s + np.log(64), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16cache", "fp8cache"])
def test_topk_length(fp8):
    q, kv, idx, rows64 = cases.make_sparse(2, b=4, s_q=3, topk=64, fp8=fp8, p_invalid=0.1)
    # Past topk_length the indices may be anything, out-of-range and into poisoned pages included.
    tl = np.array([0, 17, 64, 1], np.int32)
    for r, n in enumerate(tl):
        idx[r, :, n:] = np.where(np.arange(64 - n) % 2, 10**6, 11 * 16)  # 10**6 out of range
    out, lse = check(q, kv, idx, rows64, "bfloat16", topk_length=tl)
    assert np.isneginf(np.asarray(lse[0])).all()
    check(q, kv, idx, rows64, "bfloat16", topk_length=jnp.asarray(tl), jit=True)


def test_topk_length_traced_is_clamped():
    q, kv, idx, rows64 = cases.make_sparse(3, b=2, topk=8, p_invalid=0.0)
    f = jax.jit(lambda tl: jax_mla.mla_decode_sparse(q, kv, idx, topk_length=tl, return_lse=True))
    out, lse = f(jnp.array([-5, 99], jnp.int32))
    ref_out, ref_lse = cases.sparse_brute_force(q, rows64, idx, np.array([0, 8]))
    cases.assert_close_rounding_only(out, lse, ref_out, ref_lse, "bfloat16", 10.0)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16cache", "fp8cache"])
def test_sinks(fp8):
    q, kv, idx, rows64 = cases.make_sparse(4, b=2, s_q=2, h_q=16, topk=64, fp8=fp8)
    idx[1, 1] = -1  # an empty row stays 0 / -inf with a sink
    rng = np.random.default_rng(5)
    sink = rng.standard_normal(16).astype(np.float32) * 3
    sink[0], sink[1], sink[2] = -np.inf, 1e4, 1e30
    out, lse = check(q, kv, idx, rows64, "bfloat16", sink=sink)
    _, lse0 = jax_mla.mla_decode_sparse(q, kv, idx, return_lse=True)
    np.testing.assert_array_equal(np.asarray(lse), np.asarray(lse0))  # lse unchanged
    assert (np.asarray(out[:, :, 1:3], np.float32) == 0).all()  # +large sinks take all the mass
    out_nosink = jax_mla.mla_decode_sparse(q, kv, idx)
    np.testing.assert_array_equal(np.asarray(out[:, :, 0]), np.asarray(out_nosink[:, :, 0]))  # -inf: none


def test_softmax_scale_and_fp16():
    data = cases.make_sparse(6, s_q=2, h_q=64, topk=64, dtype="float16")
    check(*data, "float16", scale=0.01)
    check(*data, "float16", scale=0.3, jit=True)


@pytest.mark.parametrize("jit", [False, True])
def test_out_of_range_index_is_an_error(jit):
    q, kv, idx, _ = cases.make_sparse(7, b=2, s_q=2, topk=7)
    bad = idx.copy()
    bad[1, 1, 3] = 12 * 16  # == num_pages * page_size: one past the last slot
    if not jit:
        with pytest.raises(ValueError, match=r"indices\[1, 1, 3\] = 192 \(request 1, query token 1\)"):
            jax_mla.mla_decode_sparse(q, kv, bad)
        bad[1, 1, 3] = -2
        with pytest.raises(ValueError, match=r"indices\[1, 1, 3\] = -2"):
            jax_mla.mla_decode_sparse(q, kv, bad)
    else:
        f = jax.jit(jax_mla.mla_decode_sparse)
        with pytest.raises(Exception, match=r"indices\[1, 1, 3\] = 192 \(request 1, query token 1\)"):
            jax.block_until_ready(f(q, kv, jnp.asarray(bad)))
        bad[1, 1, 3] = -7
        with pytest.raises(Exception, match=r"indices\[1, 1, 3\] = -7"):
            jax.block_until_ready(f(q, kv, jnp.asarray(bad)))


def test_rank4_cache_and_vmap():
    q, kv, idx, rows64 = cases.make_sparse(8, b=2, s_q=2, topk=16)
    out = jax_mla.mla_decode_sparse(q, kv[:, :, None, :], idx)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(jax_mla.mla_decode_sparse(q, kv, idx)))
    # vmap over q, cache, indices, topk_length and sinks (per-instance caches: indices shifted).
    V = 3
    datas = [cases.make_sparse(20 + v, b=2, s_q=2, topk=16, fp8=True) for v in range(V)]
    qs, kvs, idxs = (np.stack([d[i] for d in datas]) for i in range(3))
    tls = np.array([[16, 5], [0, 16], [9, 9]], np.int32)
    sinks = np.random.default_rng(9).standard_normal((V, 16)).astype(np.float32)
    f = jax.vmap(lambda q, kv, i, tl, s: jax_mla.mla_decode_sparse(q, kv, i, topk_length=tl, attn_sink=s,
                                                                   return_lse=True))
    out, lse = f(qs, kvs, idxs, tls, sinks)
    for v in range(V):
        ref_out, ref_lse = cases.sparse_brute_force(qs[v], datas[v][3], idxs[v], tls[v], sink=sinks[v])
        cases.assert_close_rounding_only(out[v], lse[v], ref_out, ref_lse, "bfloat16", 10.0, 20.0)
    # An out-of-range index of one instance still fails under vmap (never reads another's cache).
    bad = idxs.copy()
    bad[1, 0, 0, 0] = 12 * 16
    with pytest.raises(Exception, match=r"indices\[2, 0, 0\] = -2"):
        jax.block_until_ready(jax.jit(jax.vmap(jax_mla.mla_decode_sparse))(qs, kvs, jnp.asarray(bad)))
    # vmap with a shared cache (not batched): indices unchanged.
    out2 = jax.vmap(lambda q, i: jax_mla.mla_decode_sparse(q, kvs[0], i))(qs, idxs)
    for v in range(V):
        ref_out, ref_lse = cases.sparse_brute_force(qs[v], datas[0][3], idxs[v])
        cases.assert_close_rounding_only(out2[v], ref_lse, ref_out, ref_lse, "bfloat16", 10.0, 20.0)


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16cache", "fp8cache"])
def test_one_token_page_view_is_the_dense_decode(fp8):
    """The GPU path's view (cuda/runtime/sparse_launch.h), checked with the CPU kernels: one request
    per query token, the cache as pages of one token, each request's block table its counted
    indices without -1 (in order) and seq_len their count. mla_decode over that view is
    mla_decode_sparse."""
    b, s_q, h_q, topk = 3, 2, 16, 200
    q, kv, idx, rows64 = cases.make_sparse(11, b=b, s_q=s_q, h_q=h_q, topk=topk, page_size=5, num_pages=80, fp8=fp8)
    tl = np.array([topk, 0, 77], np.int32)
    want_out, want_lse = jax_mla.mla_decode_sparse(q, kv, idx, topk_length=tl, return_lse=True)
    table = np.zeros((b * s_q, topk), np.int32)  # the compaction kernel's result (common/sparse_table.cu)
    lens = np.zeros(b * s_q, np.int32)
    for r in range(b):
        for t in range(s_q):
            kept = idx[r, t, :tl[r]][idx[r, t, :tl[r]] != -1]
            table[r * s_q + t, :kept.size] = kept
            lens[r * s_q + t] = kept.size
    slots = kv.shape[0] * kv.shape[1]
    out, lse = jax_mla.mla_decode(q.reshape(b * s_q, 1, h_q, 576), kv.reshape(slots, 1, kv.shape[-1]), table, lens,
                                  return_lse=True)
    ref_out, ref_lse = cases.sparse_brute_force(q, rows64, idx, tl)
    cases.assert_close_rounding_only(np.asarray(out).reshape(want_out.shape), np.asarray(lse).reshape(want_lse.shape),
                                     ref_out, ref_lse, "bfloat16", 10.0, 20.0)
    cases.assert_close_rounding_only(want_out, want_lse, ref_out, ref_lse, "bfloat16", 10.0, 20.0)


def test_batch_invariant_validation_and_cpu_bits():
    """batch_invariant / invariant_chunk are checked as mla_decode's; on the CPU (which never splits
    a query token's slots) a request's bits are the same alone and inside a batch, with or without
    the flag."""
    q, kv, idx, _ = cases.make_sparse(51, b=1, s_q=2, h_q=16, topk=300, page_size=16, num_pages=40)
    with pytest.raises(TypeError, match="batch_invariant must be a Python bool"):
        jax_mla.mla_decode_sparse(q, kv, idx, batch_invariant=1)
    with pytest.raises(ValueError, match="needs batch_invariant=True"):
        jax_mla.mla_decode_sparse(q, kv, idx, invariant_chunk=128)
    with pytest.raises(ValueError, match="multiple of 64"):
        jax_mla.mla_decode_sparse(q, kv, idx, batch_invariant=True, invariant_chunk=100)
    rng = np.random.default_rng(5)
    b = 9
    qb = rng.standard_normal((b,) + q.shape[1:]).astype(q.dtype)
    ib = rng.integers(0, 20 * 16, size=(b,) + idx.shape[1:]).astype(np.int32)
    qb[4], ib[4] = q[0], idx[0]
    for kw in ({}, dict(batch_invariant=True), dict(batch_invariant=True, invariant_chunk=64)):
        alone = jax_mla.mla_decode_sparse(q, kv, idx, return_lse=True, **kw)
        batch = jax_mla.mla_decode_sparse(qb, kv, ib, return_lse=True, **kw)
        np.testing.assert_array_equal(np.asarray(batch[0])[4], np.asarray(alone[0])[0])
        np.testing.assert_array_equal(np.asarray(batch[1])[4], np.asarray(alone[1])[0])
