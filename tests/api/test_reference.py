"""jax_mla.reference (fp32 jax.numpy, paged) against a float64 NumPy brute force (dense, unpaged)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cases
from jax_mla.reference import mla_decode_reference

CASES = cases.edge_cases() + cases.random_sweep(24, master_seed=1, page_sizes=(1, 16, 64, 128),
                                                budget=600_000)


reference = jax.jit(mla_decode_reference, static_argnames=("softmax_scale", "causal", "out_dtype"))


def assert_matches_brute(out, lse, want_out, want_lse, score_mag):
    # fp32 score errors grow with |score|; out and lse inherit them.
    atol = 2e-6 + 1e-6 * score_mag
    assert np.isfinite(out).all(), "reference output has non-finite values"
    empty = np.isneginf(want_lse)
    np.testing.assert_array_equal(np.isneginf(lse), empty, err_msg="rows with no visible key")
    assert (out[empty] == 0).all(), "rows with no visible key must be exactly 0"
    np.testing.assert_allclose(out, want_out, rtol=1e-5, atol=atol, err_msg="out")
    np.testing.assert_allclose(lse[~empty], want_lse[~empty], rtol=1e-6, atol=5 * atol, err_msg="lse")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_reference_matches_float64_brute_force(case):
    data = cases.make(case)
    out, lse = cases.reference(data)
    want_out, want_lse = cases.brute_force(data)
    assert_matches_brute(out, lse, want_out, want_lse, cases.max_abs_score(data))


def test_default_out_dtype_is_q_dtype_and_rounds():
    data = cases.make(cases.Case(lens=(37, 200), h_q=16, dtype="float16", seed=11))
    out, lse = reference(*data.args)
    assert out.dtype == jnp.float16 and lse.dtype == jnp.float32
    out32, _ = reference(*data.args, out_dtype=jnp.float32)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(out32).astype(np.float16))


def test_rank4_cache_same_as_rank3():
    data = cases.make(cases.Case(lens=(70, 3), s_q=2, h_q=3, page_size=16, seed=12))
    out3, lse3 = reference(*data.args)
    kv4 = data.kv_cache.reshape(data.kv_cache.shape[0], data.kv_cache.shape[1], 1, -1)
    out4, lse4 = reference(data.q, kv4, data.block_table, data.seq_lens)
    np.testing.assert_array_equal(np.asarray(out3), np.asarray(out4))
    np.testing.assert_array_equal(np.asarray(lse3), np.asarray(lse4))


def test_gradient_is_finite_despite_poisoned_pages():
    data = cases.make(cases.Case(lens=(0, 5, 130), s_q=2, h_q=3, page_size=16, causal=True, seed=13))
    q = jnp.asarray(data.q, jnp.float32)

    def loss(q):
        out, lse = mla_decode_reference(q, *data.args[1:], causal=True, out_dtype=jnp.float32)
        return jnp.sum(out ** 2) + jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0))

    g = jax.jit(jax.grad(loss))(q)
    assert np.isfinite(np.asarray(g)).all()
    assert np.abs(np.asarray(g)).max() > 0


# Negative controls: the comparison above must reject a reference that is slightly wrong.

@pytest.mark.parametrize("wrong", ["scale", "causal", "one_key_less"])
def test_comparison_detects_a_wrong_result(wrong):
    case = cases.Case(lens=(0, 9, 150, 64), s_q=3, h_q=16, page_size=16, causal=True, seed=14)
    data = cases.make(case)
    out, lse = cases.reference(data)
    if wrong == "scale":
        want = cases.brute_force(data, scale=data.scale * (1 + 2 ** -10))
    elif wrong == "causal":
        want = cases.brute_force(data, causal=False)
    else:
        shorter = data.case.replace(lens=tuple(max(n - 1, 0) if n > 100 else n for n in case.lens))
        data2 = cases.make(shorter)
        data2.q = data.q
        data2.dense_kv = [d[:n] for d, n in zip(data.dense_kv, shorter.lens)]
        want = cases.brute_force(data2)
    with pytest.raises(AssertionError):
        assert_matches_brute(out, lse, *want, cases.max_abs_score(data))
