"""jax_mla.update_kv_cache: values, in-place update of a donated cache, validation (on CPU)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cases
import jax_mla
from jax_mla import _paged_write

D = 576


pytestmark = pytest.mark.usefixtures("on_cpu")  # jax's default device: the CPU (conftest.py)


def problem(dtype="bfloat16", rank4=False, num_pages=20, page_size=8, seed=0):
    """A cache full of random bits (NaN/inf patterns included), two requests with shuffled pages
    and new tokens crossing page boundaries, one padding entry."""
    rng = np.random.default_rng(seed)
    dt = cases.DTYPES[dtype]
    bits = rng.integers(0, 2**16, size=(num_pages, page_size, D), dtype=np.uint16)
    kv = bits.view(dt)
    if rank4:
        kv = kv.reshape(num_pages, page_size, 1, D)
    table = rng.permutation(num_pages)[:12].astype(np.int32).reshape(2, 6)
    table[1, 5] = -1  # never written: past the last position used
    positions = np.array([[6, 7, 8, 9], [0, 39, -1, 17]], np.int32)  # -1: padding
    new = rng.standard_normal((2, 4, D)).astype(dt)
    return kv, new, table, positions


def expected(kv, new, table, positions):
    want = np.array(kv).reshape(kv.shape[0], kv.shape[1], D)
    page_size = kv.shape[1]
    for r in range(positions.shape[0]):
        for t in range(positions.shape[1]):
            p = int(positions[r, t])
            if p >= 0:
                want[table[r, p // page_size], p % page_size] = new[r, t]
    return want.reshape(kv.shape)


def bits(x):
    return np.asarray(x).view(np.uint16)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("rank4", [False, True])
def test_values_and_untouched_rows_bit_identical(dtype, rank4):
    kv, new, table, positions = problem(dtype, rank4)
    got = jax.jit(jax_mla.update_kv_cache)(kv, new, table, positions)
    assert got.shape == kv.shape and got.dtype == kv.dtype
    want = expected(kv, new, table, positions)
    np.testing.assert_array_equal(bits(got), bits(want))
    # Exactly the 7 written rows changed (the padding entry wrote nothing).
    changed = (bits(got) != bits(kv)).reshape(kv.shape[0] * kv.shape[1], D).any(axis=1)
    assert changed.sum() == 7
    # Eager call, same result.
    np.testing.assert_array_equal(bits(jax_mla.update_kv_cache(kv, new, table, positions)),
                                  bits(want))


def test_appended_tokens_are_what_mla_decode_reads():
    data = cases.make(cases.Case(lens=(9, 30), h_q=4, page_size=8, extra_slots=2, seed=3))
    kv, table, lens = data.kv_cache, data.block_table, data.seq_lens
    rng = np.random.default_rng(4)
    new = rng.standard_normal((2, 1, D)).astype(kv.dtype)
    kv2 = jax.jit(jax_mla.update_kv_cache)(kv, new, table, lens[:, None])
    lens2 = lens + 1
    data.kv_cache, data.seq_lens = np.asarray(kv2), lens2
    data.dense_kv = [np.concatenate([d, new[r]]) for r, d in enumerate(data.dense_kv)]
    out, lse = jax_mla.mla_decode(data.q, kv2, table, lens2, return_lse=True)
    cases.assert_close_rounding_only(out, lse, *cases.brute_force(data), "bfloat16",
                                     cases.max_abs_score(data))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("rank4", [False, True])
def test_donated_cache_is_updated_in_place(dtype, rank4):
    kv, new, table, positions = problem(dtype, rank4, num_pages=64, page_size=16)
    cache_bytes = kv.size * kv.itemsize
    step = jax.jit(jax_mla.update_kv_cache, donate_argnums=0)
    compiled = step.lower(jnp.asarray(kv), new, table, positions).compile()
    # The cache (parameter 0) is aliased to the result...
    header = compiled.as_text().splitlines()[0]
    assert re.search(r"input_output_alias=\{ \{\}: \(0, \{\}, may-alias\) \}", header), header
    stats = compiled.memory_analysis()
    assert stats.alias_size_in_bytes == cache_bytes
    temp = stats.temp_size_in_bytes
    if dtype == "bfloat16" and _paged_write._CPU_UPCASTS_BF16_SCATTER:
        # jaxlib < 0.12 on CPU: scattered as uint16 bits, through one copy (documented).
        assert cache_bytes <= temp < cache_bytes * 9 // 8, (temp, cache_bytes)
    else:
        # ...and no cache-sized temporary exists (no copy, no float32 upcast).
        assert temp < cache_bytes // 8, (temp, cache_bytes)
    x = jnp.asarray(kv)
    ptr = x.unsafe_buffer_pointer()
    out = step(x, new, table, positions)
    assert x.is_deleted() and out.unsafe_buffer_pointer() == ptr
    np.testing.assert_array_equal(bits(out), bits(expected(kv, new, table, positions)))


def test_without_donation_the_input_is_kept():
    kv, new, table, positions = problem()
    x = jnp.asarray(kv)
    jax.jit(jax_mla.update_kv_cache)(x, new, table, positions)
    np.testing.assert_array_equal(bits(x), bits(kv))


def test_traced_out_of_range_entries_are_not_written():
    kv, new, table, positions = problem()
    positions = positions.copy()
    positions[0, 0] = 6 * 8      # past the block table (capacity 48)
    positions[1, 1] = 41         # column 5 holds page id -1
    got = jax.jit(jax_mla.update_kv_cache)(kv, new, table, positions)
    np.testing.assert_array_equal(bits(got), bits(expected(kv, new, table, np.where(
        np.isin(np.arange(8).reshape(2, 4), [0, 5]), -1, positions))))


def test_vmap_and_gradient_are_those_of_the_plain_write():
    """update_kv_cache is a primitive (for its sharding rule); vmap and differentiation behave as
    for the plain jax scatter."""
    kv, new, table, positions = problem("float16")
    kv = np.where(np.isfinite(kv), kv, 0).astype(kv.dtype)
    kvs = np.stack([kv, -kv])
    got = jax.vmap(jax_mla.update_kv_cache, in_axes=(0, None, None, None))(kvs, new, table,
                                                                            positions)
    for i in range(2):
        np.testing.assert_array_equal(bits(got[i]), bits(expected(kvs[i], new, table, positions)))

    def loss(write):
        return lambda kv, rows: (write(kv, rows, table, positions).astype(jnp.float32) ** 2).sum()

    got = jax.grad(loss(jax_mla.update_kv_cache), argnums=(0, 1))(kv, new)
    want = jax.grad(loss(_paged_write.write), argnums=(0, 1))(jnp.asarray(kv), jnp.asarray(new))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(bits(g), bits(w))


def test_lowering_per_platform():
    kv, new, table, positions = problem()
    traced = jax.jit(jax_mla.update_kv_cache).trace(kv, new, table, positions)
    cpu = traced.lower(lowering_platforms=("cpu",)).as_text()
    cuda = traced.lower(lowering_platforms=("cuda",)).as_text()
    for text in (cpu, cuda):
        assert "stablehlo.scatter" in text and "unique_indices = true" in text
    assert "bitcast_convert" not in cuda
    assert ("bitcast_convert" in cpu) == _paged_write._CPU_UPCASTS_BF16_SCATTER


# ----------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------

def _args(**over):
    kv, new, table, positions = problem()
    args = dict(kv_cache=kv, new_latent=new, block_table=table, positions=positions)
    args.update(over)
    return args


@pytest.mark.parametrize("over, exc, msg", [
    (dict(kv_cache=np.zeros((4, 8, 512), np.float16)), ValueError,
     r"kv_cache must have last dimension 576, got shape \(4, 8, 512\)"),
    (dict(kv_cache=np.zeros((4, 8, 2, 576), np.float16)), ValueError,
     r"a rank-4 kv_cache must have shape \(num_pages, page_size, 1, 576\) \(one latent head\)"),
    (dict(kv_cache=np.zeros((4, 576), np.float16)), ValueError, r"kv_cache must have shape"),
    (dict(kv_cache=np.zeros((4, 8, 576), np.float32)), TypeError,
     r"kv_cache must have dtype bfloat16 or float16, got float32"),
    (dict(new_latent=np.zeros((2, 4, 512), np.float16)), ValueError,
     r"new_latent must have shape \(b, s_new, 576\).*got shape \(2, 4, 512\)"),
    (dict(new_latent=np.zeros((2, 4, 576), np.float16)), TypeError,
     r"new_latent must have the same dtype as kv_cache \(bfloat16\), got float16"),
    (dict(block_table=np.zeros((3, 6), np.int32)), ValueError,
     r"block_table must have shape \(b, max_pages\) = \(2, max_pages\).*got shape \(3, 6\)"),
    (dict(block_table=np.zeros((2, 6), np.int64)), TypeError,
     r"block_table must have dtype int32, got int64"),
    (dict(positions=np.zeros((2, 3), np.int32)), ValueError,
     r"positions must have shape \(b, s_new\) = \(2, 4\).*got shape \(2, 3\)"),
    (dict(positions=np.zeros((2, 4), np.int64)), TypeError,
     r"positions must have dtype int32, got int64"),
])
def test_shape_and_dtype_errors(over, exc, msg):
    with pytest.raises(exc, match="update_kv_cache: " + msg):
        jax_mla.update_kv_cache(**_args(**over))


def test_concrete_value_errors():
    kv, new, table, positions = problem()
    bad = positions.copy()
    bad[1, 3] = 48
    with pytest.raises(ValueError, match=r"positions must be < max_pages \* page_size = 6 \* 8 = 48.*"
                                         r"got positions\[1, 3\] = 48"):
        jax_mla.update_kv_cache(kv, new, table, bad)
    bad = positions.copy()
    bad[1, 3] = 41  # column 5: page id -1
    with pytest.raises(ValueError, match=r"page id in \[0, num_pages\) = \[0, 20\), "
                                         r"got block_table\[1, 5\] = -1 for positions\[1, 3\] = 41"):
        jax_mla.update_kv_cache(kv, new, table, bad)
    bad = positions.copy()
    bad[0, 1] = 6  # positions[0, 0] is 6 too
    with pytest.raises(ValueError, match=r"two new tokens write the same cache row.*"
                                         r"positions\[0, 0\] and positions\[0, 1\]"):
        jax_mla.update_kv_cache(kv, new, table, bad)
    shared = table.copy()
    shared[1, 0] = table[0, 0]  # request 1's position 0 lands on request 0's page, slot 0
    pos = positions.copy()
    pos[0, 0] = 0
    with pytest.raises(ValueError, match="requests must not share the pages they write"):
        jax_mla.update_kv_cache(kv, new, shared, pos)


# ----------------------------------------------------------------------------------------------
# FP8 caches (uint8 rows of 656 bytes): new rows are quantized as pack_fp8_kv does
# ----------------------------------------------------------------------------------------------

ROW = 656


def problem_fp8(new_dtype="float32", rank4=False, num_pages=20, page_size=8, seed=0):
    """problem() over a uint8 cache of random bytes, with new rows in new_dtype."""
    rng = np.random.default_rng(seed)
    kv = rng.integers(0, 256, size=(num_pages, page_size, ROW), dtype=np.uint8)
    if rank4:
        kv = kv.reshape(num_pages, page_size, 1, ROW)
    _, _, table, positions = problem(seed=seed, num_pages=num_pages, page_size=page_size)
    new = (rng.standard_normal((2, 4, D)) * rng.choice([1e-3, 1.0, 30.0], size=(2, 4, 1)))
    return kv, new.astype(np.dtype(jnp.bfloat16) if new_dtype == "bfloat16" else new_dtype), table, positions


def _expected_rows(kv, rows, table, positions):
    """expected() for rows of any width (the packed FP8 rows)."""
    want = np.array(kv).reshape(kv.shape[0], kv.shape[1], rows.shape[-1])
    for r in range(positions.shape[0]):
        for t in range(positions.shape[1]):
            p = int(positions[r, t])
            if p >= 0:
                want[table[r, p // kv.shape[1]], p % kv.shape[1]] = rows[r, t]
    return want.reshape(kv.shape)


@pytest.mark.parametrize("new_dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("rank4", [False, True])
def test_fp8_rows_are_quantized_like_pack_fp8_kv(new_dtype, rank4):
    kv, new, table, positions = problem_fp8(new_dtype, rank4)
    got = jax.jit(jax_mla.update_kv_cache)(kv, new, table, positions)
    assert got.shape == kv.shape and got.dtype == np.uint8
    want = _expected_rows(kv, np.asarray(jax_mla.pack_fp8_kv(new)), table, positions)
    np.testing.assert_array_equal(np.asarray(got), want)
    changed = (np.asarray(got) != kv).reshape(-1, ROW).any(axis=1)
    assert changed.sum() == 7  # the padding entry wrote nothing
    np.testing.assert_array_equal(np.asarray(jax_mla.update_kv_cache(kv, new, table, positions)), want)
    # What mla_decode reads back is unpack_fp8_kv of those rows.
    back = np.asarray(jax_mla.unpack_fp8_kv(np.asarray(got)[table[0, 0], 6:8].reshape(2, ROW)))
    np.testing.assert_array_equal(back, np.asarray(jax_mla.unpack_fp8_kv(jax_mla.pack_fp8_kv(new[0, :2]))))


@pytest.mark.parametrize("rank4", [False, True])
def test_fp8_donated_cache_is_updated_in_place(rank4):
    kv, new, table, positions = problem_fp8("bfloat16", rank4, num_pages=64, page_size=16)
    cache_bytes = kv.size
    step = jax.jit(jax_mla.update_kv_cache, donate_argnums=0)
    compiled = step.lower(jnp.asarray(kv), new, table, positions).compile()
    header = compiled.as_text().splitlines()[0]
    assert re.search(r"input_output_alias=\{ \{\}: \(0, \{\}, may-alias\) \}", header), header
    stats = compiled.memory_analysis()
    assert stats.alias_size_in_bytes == cache_bytes
    assert stats.temp_size_in_bytes < cache_bytes // 8, (stats.temp_size_in_bytes, cache_bytes)
    x = jnp.asarray(kv)
    ptr = x.unsafe_buffer_pointer()
    out = step(x, new, table, positions)
    assert x.is_deleted() and out.unsafe_buffer_pointer() == ptr
    np.testing.assert_array_equal(np.asarray(out), _expected_rows(
        kv, np.asarray(jax_mla.pack_fp8_kv(new)), table, positions))


def test_fp8_traced_out_of_range_entries_are_not_written():
    kv, new, table, positions = problem_fp8()
    positions = positions.copy()
    positions[0, 0] = 6 * 8      # past the block table (capacity 48)
    positions[1, 1] = 41         # column 5 holds page id -1
    got = jax.jit(jax_mla.update_kv_cache)(kv, new, table, positions)
    kept = np.where(np.isin(np.arange(8).reshape(2, 4), [0, 5]), -1, positions)
    np.testing.assert_array_equal(np.asarray(got), _expected_rows(
        kv, np.asarray(jax_mla.pack_fp8_kv(new)), table, kept))


def test_fp8_appended_tokens_are_what_mla_decode_reads():
    data = cases.make_fp8(cases.Case(lens=(9, 30), h_q=4, page_size=8, extra_slots=2, seed=3))
    kv, table, lens = data.kv_cache, data.block_table, data.seq_lens
    new = np.random.default_rng(4).standard_normal((2, 1, D)).astype(np.float32)
    kv2 = jax.jit(jax_mla.update_kv_cache)(kv, new, table, lens[:, None])
    lens2 = lens + 1
    deq = np.asarray(jax_mla.unpack_fp8_kv(jax_mla.pack_fp8_kv(new)))
    data.kv_cache, data.seq_lens = np.asarray(kv2), lens2
    data.dense_kv = [np.concatenate([d, deq[r]]) for r, d in enumerate(data.dense_kv)]
    out, lse = jax_mla.mla_decode(data.q, kv2, table, lens2, return_lse=True)
    cases.assert_close_rounding_only(out, lse, *cases.brute_force(data), "bfloat16",
                                     cases.max_abs_score(data), cases.max_abs_value(data))


def test_fp8_lowering_per_platform():
    kv, new, table, positions = problem_fp8("bfloat16")
    traced = jax.jit(jax_mla.update_kv_cache).trace(kv, new, table, positions)
    for platform in ("cpu", "cuda"):
        text = traced.lower(lowering_platforms=(platform,)).as_text()
        assert "stablehlo.scatter" in text and "unique_indices = true" in text
        assert "656xui8" in text


@pytest.mark.parametrize("over, exc, msg", [
    (dict(kv_cache=np.zeros((4, 8, 576), np.uint8)), ValueError,
     r"a uint8 kv_cache holds FP8 rows \(pack_fp8_kv\) and must have last dimension 656, "
     r"got shape \(4, 8, 576\)"),
    (dict(kv_cache=np.zeros((4, 8, 2, 656), np.uint8)), ValueError,
     r"a rank-4 kv_cache must have shape \(num_pages, page_size, 1, 656\)"),
    (dict(kv_cache=np.zeros((4, 8, 656), np.float16)), ValueError,
     r"kv_cache must have last dimension 576, got shape \(4, 8, 656\) \(a cache of 656-byte FP8 rows "
     r"must have dtype uint8\)"),
    (dict(kv_cache=np.zeros((4, 8, 576), np.int8)), TypeError,
     r"kv_cache must have dtype bfloat16 or float16, got int8 \(or uint8 for FP8 rows"),
    (dict(new_latent=np.zeros((2, 4, 576), np.int32)), TypeError,
     r"new_latent must have dtype bfloat16, float16 or float32 for a uint8 \(FP8\) kv_cache"),
    (dict(new_latent=np.zeros((2, 4, 656), np.uint8)), ValueError,
     r"new_latent must have shape \(b, s_new, 576\)"),
])
def test_fp8_shape_and_dtype_errors(over, exc, msg):
    kv, new, table, positions = problem_fp8()
    args = dict(kv_cache=kv, new_latent=new, block_table=table, positions=positions)
    args.update(over)
    with pytest.raises(exc, match="update_kv_cache: " + msg):
        jax_mla.update_kv_cache(**args)
