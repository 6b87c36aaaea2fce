"""pack_fp8_kv / unpack_fp8_kv: the 656-byte FP8 row format, bit-exact against a NumPy reference."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import jax_mla

pytestmark = pytest.mark.usefixtures("on_cpu")  # jax's default device: the CPU (conftest.py)

DTYPES = [np.dtype(jnp.bfloat16), np.dtype(np.float16), np.dtype(np.float32)]


# ---------------------------------------------------------------------------------------------
# Independent reference: float64 NumPy, math.frexp for the scale, ml_dtypes for the e4m3 cast,
# explicit little-endian views for the bytes.

def ref_scale(amax: float) -> float:
    y = max(amax / 448.0, 1e-4)
    m, e = math.frexp(y)  # y = m * 2**e, 0.5 <= m < 1
    return math.ldexp(1.0, e - 1 if m == 0.5 else e)


def ref_pack(rows: np.ndarray) -> np.ndarray:
    lead = rows.shape[:-1]
    flat = rows.reshape(-1, 576)
    out = np.zeros((flat.shape[0], 656), np.uint8)
    for i, row in enumerate(flat):
        x = row.astype(np.float64)
        scales = []
        for t in range(4):
            tile = x[128 * t:128 * (t + 1)]
            s = ref_scale(float(np.max(np.abs(tile))))
            scales.append(s)
            q = np.clip(tile / s, -448.0, 448.0).astype(ml_dtypes.float8_e4m3fn)
            out[i, 128 * t:128 * (t + 1)] = q.view(np.uint8)
        out[i, 512:528] = np.array(scales, dtype="<f4").view(np.uint8)
        rope = row[512:].astype(ml_dtypes.bfloat16).view(np.uint16).astype("<u2")
        out[i, 528:] = rope.view(np.uint8)
    return out.reshape(*lead, 656)


def make_rows(dtype: np.dtype, n: int, seed: int) -> np.ndarray:
    """Rows whose tiles have many magnitudes: zeros, tiny (the 1e-4 floor applies), ordinary, large,
    amax exactly 448 * 2**k or 2**k, and just above 448 * 2**k."""
    rng = np.random.default_rng(seed)
    big = 1e4 if dtype == np.float16 else 1e30
    mags = [0.0, 1e-6, 3e-3, 0.0448, 1.0, 7.5, 448.0, 1000.0, big]
    rows = np.empty((n, 576), np.float64)
    for i in range(n):
        for t in range(4):
            tile = rng.standard_normal(128) * mags[rng.integers(len(mags))]
            kind = rng.integers(4)
            k = int(rng.integers(-8, 6))
            j = int(rng.integers(128))
            if kind == 1:
                tile = np.clip(tile, -448 * 2.0**k, 448 * 2.0**k)
                tile[j] = rng.choice([-1, 1]) * 448 * 2.0**k  # amax / 448 is exactly 2**k
            elif kind == 2:
                tile = np.clip(tile, -(2.0**k), 2.0**k)
                tile[j] = 2.0**k
            elif kind == 3:
                tile = np.clip(tile, -448 * 2.0**k, 448 * 2.0**k)
                tile[j] = 448 * 2.0**k * (1 + 2**-7)  # just above: the scale doubles
            rows[i, 128 * t:128 * (t + 1)] = tile
        rows[i, 512:] = rng.standard_normal(64) * 3
    return rows.astype(dtype)


def tile_scales(packed: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(packed)[..., 512:528]).view("<f4")


# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_pack_matches_numpy_reference_bytewise(dtype):
    rows = make_rows(dtype, 64, seed=1)
    got = np.asarray(jax_mla.pack_fp8_kv(jnp.asarray(rows)))
    assert got.dtype == np.uint8 and got.shape == (64, 656)
    want = ref_pack(rows)
    bad = np.argwhere(got != want)
    assert bad.size == 0, f"{len(bad)} bytes differ, first at {bad[0]}"


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_round_trip_within_e4m3_bound(dtype):
    rows = make_rows(dtype, 64, seed=2)
    packed = jax_mla.pack_fp8_kv(jnp.asarray(rows))
    back = np.asarray(jax_mla.unpack_fp8_kv(packed), np.float64)
    assert back.shape == (64, 576) and back.dtype == np.float64
    x = rows.astype(np.float64)
    scale = np.repeat(tile_scales(packed).astype(np.float64), 128, axis=-1)
    # x / scale is at most 448 in magnitude (no saturation); e4m3 keeps 3 mantissa bits, so a
    # normal value (|x / scale| >= 2**-6) is off by at most half an ulp, 2**-4 relative, and a
    # subnormal one by at most half the subnormal step 2**-9, i.e. 2**-10 * scale.
    bound = np.maximum(np.abs(x[:, :512]) * 2.0**-4, scale * 2.0**-10)
    err = np.abs(back[:, :512] - x[:, :512])
    assert (err <= bound).all(), float(np.max(err / bound))
    np.testing.assert_array_equal(back[:, 512:], rows[:, 512:].astype(ml_dtypes.bfloat16).astype(np.float64))
    # zeros stay zeros
    zero_tiles = (x[:, :512].reshape(64, 4, 128) == 0).all(-1)
    assert (back[:, :512].reshape(64, 4, 128)[zero_tiles] == 0).all()


def test_unpack_dtypes():
    rows = make_rows(np.dtype(np.float16), 8, seed=3)
    packed = jax_mla.pack_fp8_kv(rows)
    f32 = jax_mla.unpack_fp8_kv(packed)
    assert f32.dtype == jnp.float32
    for dt in (jnp.bfloat16, np.float16, "float32"):
        out = jax_mla.unpack_fp8_kv(packed, dtype=dt)
        assert out.dtype == np.dtype(dt)
        np.testing.assert_array_equal(np.asarray(out), np.asarray(f32.astype(dt)))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_scales_are_powers_of_two(dtype):
    rows = make_rows(dtype, 64, seed=4)
    scales = tile_scales(jax_mla.pack_fp8_kv(rows)).astype(np.float64)
    amax = np.abs(rows[:, :512].astype(np.float64)).reshape(64, 4, 128).max(-1)
    mant, _ = np.frexp(scales)
    assert (mant == 0.5).all()
    assert (scales >= 2.0**-13).all()
    need = np.maximum(amax / 448, 1e-4)
    assert (scales >= need).all() and (scales / 2 < need).all()  # the smallest power of two


def test_tile_order_and_endianness():
    """Tile t's largest value is 448 * 2**(t + 1) at index t of the tile, so the scales are 2, 4, 8,
    16 in that order; swapped tiles or big-endian bytes would show here."""
    rows = np.zeros((576,), np.float32)
    for t in range(4):
        rows[128 * t + t] = 448 * 2.0 ** (t + 1)
        rows[128 * t + 127] = -(2.0 ** (t + 1))  # -1.0 after scaling: e4m3 byte 0xB8
    rows[512] = 1.0  # bfloat16 0x3F80 -> bytes 0x80, 0x3F
    rows[575] = -2.0  # bfloat16 0xC000 -> bytes 0x00, 0xC0
    packed = np.asarray(jax_mla.pack_fp8_kv(rows))
    assert packed.shape == (656,)
    np.testing.assert_array_equal(packed[512:528].view("<f4"), [2.0, 4.0, 8.0, 16.0])
    assert packed[512:516].tolist() == [0x00, 0x00, 0x00, 0x40]  # 2.0f little-endian
    for t in range(4):
        tile = packed[128 * t:128 * (t + 1)]
        assert tile[t] == 0x7E and tile[127] == 0xB8  # 448 and -1 in e4m3
        assert np.count_nonzero(tile) == 2
    assert packed[528:530].tolist() == [0x80, 0x3F]
    assert packed[654:656].tolist() == [0x00, 0xC0]
    assert np.count_nonzero(packed[530:654]) == 0
    back = np.asarray(jax_mla.unpack_fp8_kv(packed))
    np.testing.assert_array_equal(back, rows)  # every value here is exact in the format


def test_jit_vmap_and_leading_dims():
    rows = make_rows(np.dtype(jnp.bfloat16), 12, seed=5).reshape(3, 4, 576)
    eager = np.asarray(jax_mla.pack_fp8_kv(rows))
    assert eager.shape == (3, 4, 656)
    np.testing.assert_array_equal(eager.reshape(12, 656), ref_pack(rows.reshape(12, 576)))
    np.testing.assert_array_equal(np.asarray(jax.jit(jax_mla.pack_fp8_kv)(rows)), eager)
    np.testing.assert_array_equal(np.asarray(jax.vmap(jax_mla.pack_fp8_kv)(rows)), eager)
    np.testing.assert_array_equal(np.asarray(jax.vmap(jax.vmap(jax_mla.pack_fp8_kv))(rows)), eager)
    back = np.asarray(jax_mla.unpack_fp8_kv(eager, jnp.bfloat16))
    unpack_bf16 = lambda p: jax_mla.unpack_fp8_kv(p, jnp.bfloat16)  # noqa: E731
    np.testing.assert_array_equal(np.asarray(jax.jit(unpack_bf16)(eager)), back)
    np.testing.assert_array_equal(np.asarray(jax.vmap(unpack_bf16)(eager)), back)
    round_trip = jax.jit(lambda r: jax_mla.unpack_fp8_kv(jax_mla.pack_fp8_kv(r), jnp.bfloat16))
    np.testing.assert_array_equal(np.asarray(round_trip(rows)), back)


def test_non_finite_inputs_poison_only_their_tile():
    rows = np.ones((3, 576), np.float32)
    rows[0, 5] = np.nan  # tile 0 of row 0
    rows[1, 130] = np.inf  # tile 1 of row 1
    rows[1, 131] = -np.inf
    rows[2, 400] = np.nan  # tile 3 of row 2, and RoPE values
    rows[2, 520] = np.inf
    rows[2, 521] = np.nan
    packed = np.asarray(jax_mla.pack_fp8_kv(rows))
    scales = tile_scales(packed)
    assert np.isnan(scales[0, 0]) and (scales[0, 1:] == 2.0**-8).all()
    assert scales[1, 1] == np.inf and (scales[1, [0, 2, 3]] == 2.0**-8).all()
    assert np.isnan(scales[2, 3]) and (scales[2, :3] == 2.0**-8).all()
    # values of a NaN tile are all e4m3 NaN (0x7F / 0xFF); an inf tile stores 0 and NaN for +-inf
    assert np.isin(packed[0, :128], [0x7F, 0xFF]).all()
    tile1 = packed[1, 128:256]
    assert np.isin(tile1[[2, 3]], [0x7F, 0xFF]).all() and (np.delete(tile1, [2, 3]) == 0).all()
    back = np.asarray(jax_mla.unpack_fp8_kv(packed))
    poisoned = np.zeros((3, 576), bool)
    poisoned[0, :128] = poisoned[1, 128:256] = poisoned[2, 384:512] = True
    assert np.isnan(back[poisoned]).all()
    assert back[2, 520] == np.inf and np.isnan(back[2, 521])
    rest = ~poisoned
    rest[2, 520:522] = False
    assert (back[rest] == 1.0).all()


def test_saturation_guard():
    """Values at the clamp edge still encode as 448, never as NaN (JAX's cast turns > 464 into NaN)."""
    rows = np.zeros((576,), np.float32)
    rows[0] = 448.0
    rows[1] = -448.0
    rows[2] = 447.0
    packed = np.asarray(jax_mla.pack_fp8_kv(rows))
    assert packed[512:516].view("<f4")[0] == 1.0
    assert packed[:3].tolist() == [0x7E, 0xFE, 0x7E]


@pytest.mark.parametrize("bad, exc, words", [
    (np.zeros((2, 512), np.float32), ValueError, ["pack_fp8_kv", "rows", "576", "(2, 512)"]),
    (np.zeros((), np.float32), ValueError, ["pack_fp8_kv", "rows", "()"]),
    (np.zeros((2, 576), np.int32), TypeError, ["pack_fp8_kv", "rows", "int32"]),
    (np.zeros((2, 576), np.float64), TypeError, ["pack_fp8_kv", "rows", "float64"]),
])
def test_pack_bad_inputs(bad, exc, words):
    with pytest.raises(exc) as info:
        jax_mla.pack_fp8_kv(bad)
    for w in words:
        assert w in str(info.value)


@pytest.mark.parametrize("bad, kw, exc, words", [
    (np.zeros((2, 576), np.uint8), {}, ValueError, ["unpack_fp8_kv", "packed", "656", "(2, 576)"]),
    (np.zeros((2, 656), np.int8), {}, TypeError, ["unpack_fp8_kv", "packed", "uint8", "int8"]),
    (np.zeros((2, 656), np.uint8), {"dtype": jnp.int32}, TypeError, ["unpack_fp8_kv", "dtype", "int32"]),
    (np.zeros((2, 656), np.uint8), {"dtype": "nonsense"}, TypeError, ["unpack_fp8_kv", "dtype", "nonsense"]),
])
def test_unpack_bad_inputs(bad, kw, exc, words):
    with pytest.raises(exc) as info:
        jax_mla.unpack_fp8_kv(bad, **kw)
    for w in words:
        assert w in str(info.value)


def test_bad_inputs_under_jit():
    with pytest.raises(ValueError, match="rows"):
        jax.jit(jax_mla.pack_fp8_kv)(jnp.zeros((4, 575), jnp.bfloat16))
