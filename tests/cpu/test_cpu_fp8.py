"""mla_decode over an FP8 cache (uint8 rows of 656 bytes, jax_mla.pack_fp8_kv) on the CPU kernel.

The ground truth is the float64 decode over unpack_fp8_kv(kv_cache): cases.make_fp8 keeps each
request's dequantized rows, which cases.brute_force reads. The bound asserted (README, "FP8 cache"):

    |out - ref| <= u |ref| + V (1e-5 + 2e-6 S),   |lse - ref_lse| <= 1e-5 max(|ref_lse|, 1)

u: unit roundoff of q's dtype (2^-8 bf16, 2^-11 fp16), V = max(1, max |v|) over the cached values,
S = max |softmax_scale q.k|. Why it holds: the kernel dequantizes each row exactly as
unpack_fp8_kv does in float32 (float(e4m3) * scale is one fp32 product, exact for power-of-two
scales; the bf16 RoPE values are exact in fp32) and q (bf16 or fp16) converts exactly, so its only
errors are those of the 16-bit path: fp32 accumulation (relative ~1e-6 of the values, plus score
rounding that grows with S) and the final rounding of out to q's dtype (u |out|). The lse is fp32
throughout. The FP8 quantization error itself (of pack_fp8_kv, up to 2^-4 relative per value) is
not part of the bound: the dequantized cache is the input.

Unused memory is poisoned (unused pages all 0xFF: NaN values, scales and RoPE; rows past seq_len:
NaN or inf scales), so reading any of it turns the result into NaN and fails check_structure.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cases
import jax_mla

pytestmark = pytest.mark.usefixtures("on_cpu")  # jax's default device: the CPU (conftest.py)

PAGE_SIZES = (16, 32, 64, 128, 256)


def run(data, **overrides):
    kw = dict(softmax_scale=data.case.softmax_scale, causal=data.case.causal, return_lse=True)
    kw.update(overrides)
    return jax_mla.mla_decode(*data.args, **kw)


def check_fp8(data, out, lse, **ref_overrides):
    """Against float64 on the dequantized cache, with the bound of the module docstring."""
    case = data.case
    assert out.shape == (case.b, case.s_q, case.h_q, 512) and out.dtype == np.dtype(case.dtype)
    assert lse.shape == (case.b, case.s_q, case.h_q) and lse.dtype == np.float32
    ref_out, ref_lse = cases.brute_force(data, **ref_overrides)
    cases.assert_close_rounding_only(out, lse, ref_out, ref_lse, case.dtype,
                                     cases.max_abs_score(data, ref_overrides.get("scale")),
                                     cases.max_abs_value(data))


def edge_cases() -> list[cases.Case]:
    out = []
    seed = 36000
    # Each GPU page size (656-byte rows make boxes and alignment awkward there), plus 1 and 5
    # (the CPU takes any page size): empty, single-token, page boundaries +-1, odd lengths.
    for page in PAGE_SIZES + (1, 5):
        for causal in (False, True):
            seed += 1
            out.append(cases.Case(lens=(0, 1, max(page - 1, 2), page, page + 1, 3, 0, 2 * page + 7),
                                  s_q=3, h_q=3, page_size=page, causal=causal, seed=seed))
    # s_q 1..8, causal or not, with lengths below, at and above s_q.
    for s_q in range(1, 9):
        for causal in (False, True):
            seed += 1
            out.append(cases.Case(lens=(s_q - 1, s_q, 77, 0, 130), s_q=s_q, h_q=16, page_size=32,
                                  causal=causal, seed=seed, dtype=("bfloat16", "float16")[s_q % 2]))
    # Head counts 1..128 in both q dtypes, across several KV blocks and split-KV pieces.
    for h_q in (1, 16, 64, 128):
        for dtype in ("bfloat16", "float16"):
            seed += 1
            out.append(cases.Case(lens=(1, 257, 1000), s_q=2 if h_q <= 64 else 1, h_q=h_q,
                                  page_size=64, dtype=dtype, causal=True, seed=seed))
    out += [
        cases.Case(lens=(0,), h_q=1, seed=36900),                                     # nothing
        cases.Case(lens=(0, 0, 0), s_q=8, h_q=16, causal=True, seed=36901),
        cases.Case(lens=(2,), s_q=8, h_q=16, causal=True, page_size=16, seed=36902),  # len < s_q
        cases.Case(lens=(2500,), s_q=4, h_q=16, causal=True, page_size=256, seed=36903),
        cases.Case(lens=(100,), h_q=128, softmax_scale=0.3, q_std=2.0, seed=36904),    # peaky
        cases.Case(lens=(77, 64, 300), h_q=16, page_size=16, rank4_cache=True, seed=36905),
        cases.Case(lens=(129, 63), h_q=64, page_size=128, dtype="float16", rank4_cache=True,
                   extra_pages=0, extra_slots=0, seed=36906),                         # no spare
    ]
    return out


EDGE = edge_cases()
SWEEP = cases.random_sweep(24, master_seed=36, page_sizes=PAGE_SIZES, max_s_q=8, budget=800_000)


@pytest.mark.parametrize("case", EDGE + SWEEP, ids=lambda c: c.id)
def test_fp8_cache_matches_float64_on_the_dequantized_cache(case):
    data = cases.make_fp8(case)
    check_fp8(data, *run(data))


def test_cases_cover_the_brief():
    every = EDGE + SWEEP
    assert {c.page_size for c in every} >= set(PAGE_SIZES)
    assert {c.s_q for c in every} == set(range(1, 9))
    assert {c.h_q for c in every} >= {1, 16, 64, 128}
    assert {c.dtype for c in every} == {"bfloat16", "float16"}
    assert {c.causal for c in every} == {False, True}
    lens = {n for c in every for n in c.lens}
    assert 0 in lens and 1 in lens and any(n % 2 for n in lens) and max(lens) >= 2000
    assert any(c.rank4_cache for c in every)
    for page in PAGE_SIZES:  # a length on each side of a page boundary
        assert {page - 1, page + 1} <= {n for c in every if c.page_size == page for n in c.lens}


def test_poison_is_what_the_kernel_must_not_read():
    """The test data really is poisoned: unpacking the whole cache gives NaN in every unused page
    and every row past seq_len, so a kernel reading one would produce NaN."""
    data = cases.make_fp8(cases.Case(lens=(5, 16, 40), h_q=4, page_size=16, seed=36950))
    full = np.asarray(jax_mla.unpack_fp8_kv(data.kv_cache, jnp.float32))
    used = np.zeros(full.shape[:2], bool)
    for r, n in enumerate(data.case.lens):
        for t in range(n):
            used[data.block_table[r, t // 16], t % 16] = True
    assert np.isfinite(full[used]).all()
    assert np.isnan(full[~used][:, :512]).any(axis=1).all()
    assert np.isnan(full[~used][:, 512:]).all()
    # Rows past seq_len inside a used page: only their scale bytes are non-finite.
    scales = data.kv_cache[data.block_table[0, 0], 5:, 512:528].copy().view("<f4")
    assert not np.isfinite(scales).any()


def test_nan_in_a_used_row_reaches_the_result():
    """The converse of the poison rule: the same NaN scale in a row below seq_len is read (so the
    poison checks above could fail) and makes exactly that request's output NaN."""
    data = cases.make_fp8(cases.Case(lens=(20, 20), h_q=4, page_size=16, seed=36951))
    kv = data.kv_cache.copy()
    page = data.block_table[1, 1]  # request 1, tokens 16..19
    kv[page, 3, 512:516] = np.array([np.nan], "<f4").view(np.uint8)
    out, lse = jax_mla.mla_decode(data.q, kv, data.block_table, data.seq_lens, return_lse=True)
    out, lse = np.asarray(out, np.float32), np.asarray(lse)
    assert np.isnan(out[1]).all() and np.isnan(lse[1]).all()
    assert np.isfinite(out[0]).all() and np.isfinite(lse[0]).all()


@pytest.mark.parametrize("rank4", [False, True])
def test_bf16_q_is_bit_identical_to_the_dequantized_bf16_cache(rank4):
    """Dequantizing into bf16 is exact (4 significant bits times a power of two; bf16 RoPE stored
    as is), and the CPU kernel computes in fp32 from the same values either way: an FP8 cache and
    unpack_fp8_kv(cache, bfloat16) give the same bits."""
    data = cases.make_fp8(cases.Case(lens=(0, 1, 63, 64, 65, 700), s_q=2, h_q=16, page_size=32,
                                     causal=True, rank4_cache=rank4, seed=36952))
    dense = np.asarray(jax_mla.unpack_fp8_kv(data.kv_cache, jnp.bfloat16))
    a = run(data)
    b = jax_mla.mla_decode(data.q, dense, data.block_table, data.seq_lens, causal=True,
                           return_lse=True)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(np.asarray(x).view(np.uint8), np.asarray(y).view(np.uint8))


def test_reference_reads_the_fp8_cache():
    data = cases.make_fp8(cases.Case(lens=(5, 130, 0), s_q=2, h_q=8, page_size=16, causal=True,
                                     seed=36953))
    out, lse = cases.reference(data)
    ref_out, ref_lse = cases.brute_force(data)
    np.testing.assert_allclose(out, ref_out, atol=2e-5 * cases.max_abs_value(data))
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(ref_lse))
    fin = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse[fin], ref_lse[fin], rtol=1e-5)


# ----------------------------------------------------------------------------------------------
# Schedules, jit, vmap, return_lse
# ----------------------------------------------------------------------------------------------

SCHEDULE_CASE = cases.Case(lens=(0, 1, 700, 64, 2000, 129, 3, 0), s_q=2, h_q=16, page_size=16,
                           causal=True, seed=36960)


def test_precomputed_schedule_and_num_parts():
    data = cases.make_fp8(SCHEDULE_CASE)
    in_op = run(data)
    sched = jax_mla.decode_schedule(data.seq_lens, num_heads=16, seq_q=2)
    for x, y in zip(run(data, schedule=sched), in_op):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    check_fp8(data, *in_op)
    for num_parts in (1, 7, 132):
        sched = jax_mla.decode_schedule(data.seq_lens, num_heads=16, seq_q=2, num_parts=num_parts)
        check_fp8(data, *run(data, schedule=sched))
    other = jax_mla.decode_schedule(data.seq_lens[::-1].copy(), num_heads=16, seq_q=2)
    with pytest.raises(Exception, match="schedule"):
        jax.block_until_ready(run(data, schedule=other))


def test_jit_equals_eager_and_return_lse_false():
    data = cases.make_fp8(cases.Case(lens=(0, 130, 7), s_q=2, h_q=16, causal=True, seed=36961))
    eager = run(data)
    jitted = jax.jit(lambda *a: jax_mla.mla_decode(*a, causal=True, return_lse=True))(*data.args)
    for x, y in zip(eager, jitted):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    out_only = run(data, return_lse=False)
    np.testing.assert_array_equal(np.asarray(out_only), np.asarray(eager[0]))


@pytest.mark.parametrize("rank4", [False, True])
def test_vmap_over_caches(rank4):
    """vmap with a batched uint8 cache: the instances' caches are laid end to end (their page ids
    shifted), which must not mix instances up or read another instance's poisoned pages."""
    datas = [cases.make_fp8(cases.Case(lens=(9, 70), h_q=4, page_size=16, extra_pages=2,
                                       rank4_cache=rank4, seed=36970 + i)) for i in range(3)]
    num_pages = max(d.kv_cache.shape[0] for d in datas)
    width = max(d.block_table.shape[1] for d in datas)
    kv = np.stack([np.pad(d.kv_cache, [(0, num_pages - d.kv_cache.shape[0])] +
                          [(0, 0)] * (d.kv_cache.ndim - 1), constant_values=0xFF) for d in datas])
    bt = np.stack([np.pad(d.block_table, [(0, 0), (0, width - d.block_table.shape[1])],
                          constant_values=-1) for d in datas])
    q = np.stack([d.q for d in datas])
    sl = np.stack([d.seq_lens for d in datas])
    fn = jax.vmap(lambda *a: jax_mla.mla_decode(*a, return_lse=True))
    out, lse = fn(q, kv, bt, sl)
    for i, d in enumerate(datas):
        check_fp8(d, np.asarray(out[i]), np.asarray(lse[i]))
    # Shared cache, batched queries (the cache is broadcast, not copied per instance).
    out, lse = jax.vmap(lambda q: jax_mla.mla_decode(q, datas[0].kv_cache, datas[0].block_table,
                                                     datas[0].seq_lens, return_lse=True))(q[:, :1].repeat(2, 1))
    for i in range(3):
        ref = datas[0]
        qd = cases.CaseData(ref.case, np.asarray(q[i, :1].repeat(2, 0)), ref.kv_cache, ref.block_table,
                            ref.seq_lens, ref.dense_kv)
        check_fp8(qd, np.asarray(out[i]), np.asarray(lse[i]))


# ----------------------------------------------------------------------------------------------
# Invalid page ids
# ----------------------------------------------------------------------------------------------

def test_invalid_page_ids_are_refused():
    data = cases.make_fp8(cases.Case(lens=(5, 40), h_q=4, page_size=16, seed=36980))
    for bad in (-1, data.kv_cache.shape[0], 2**31 - 1):
        table = data.block_table.copy()
        table[1, 2] = bad  # request 1 reads 3 pages
        with pytest.raises(ValueError, match=r"block_table\[1, 2\]"):
            jax_mla.mla_decode(data.q, data.kv_cache, table, data.seq_lens)
        # Traced: the CPU handler checks the ids it reads before the kernel runs.
        with pytest.raises(Exception, match=r"block_table\[1, 2\] = .* is not a page of kv_cache"):
            jax.block_until_ready(jax.jit(jax_mla.mla_decode)(data.q, data.kv_cache, table,
                                                              data.seq_lens))


# ----------------------------------------------------------------------------------------------
# The dequantization itself, value by value
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_one_token_returns_its_dequantized_row_exactly(dtype):
    """With seq_len = 1 the softmax weight is exactly 1, so out is the token's value row rounded
    once to q's dtype: out must equal unpack_fp8_kv(row) cast to that dtype, bit for bit. The rows
    hold every finite e4m3 byte (subnormals, both signs, 448) under power-of-two scales from the
    1e-4 floor's 2^-13 up, and a scale that is not a power of two (the product then rounds in
    float32, as unpack_fp8_kv's does); the RoPE part carries bf16 values of many magnitudes."""
    finite = np.array([v for v in range(256) if v & 0x7F != 0x7F], np.uint8)  # 254 values
    scales = [2.0**-13, 2.0**-4, 1.0, 2.0**5, 0.3] if dtype == "bfloat16" else [2.0**-13, 1.0, 2.0**5]
    rows = []
    for scale in scales:
        for start in range(0, finite.size, 128):
            row = np.zeros(656, np.uint8)
            lat = np.resize(np.roll(finite, -start), 512)
            row[:512] = lat
            row[512:528] = np.array([scale, scale * 2, scale, scale / 2], "<f4").view(np.uint8)
            rope = (np.random.default_rng(start).standard_normal(64) * 10.0 ** np.arange(-3, 5).repeat(8))
            row[528:] = rope.astype(jnp.bfloat16).view(np.uint16).astype("<u2").view(np.uint8)
            rows.append(row)
    b = len(rows)
    kv = np.stack(rows)[:, None, :]  # one token per page
    q = np.random.default_rng(0).standard_normal((b, 1, 2, 576)).astype(cases.DTYPES[dtype])
    table = np.arange(b, dtype=np.int32)[:, None]
    out = np.asarray(jax_mla.mla_decode(q, kv, table, np.ones(b, np.int32)))
    want = np.asarray(jax_mla.unpack_fp8_kv(kv[:, 0], jnp.float32))[:, :512].astype(cases.DTYPES[dtype])
    assert np.isfinite(want.astype(np.float32)).all() and (want != 0).sum() > 0.9 * want.size
    for h in range(2):  # equal values (-0 comes out as +0: the output sum starts from +0)
        np.testing.assert_array_equal(out[:, 0, h].astype(np.float32), want.astype(np.float32))
