"""The FP8 latent-cache row format (FlashMLA's DeepSeek-V3.2 layout): pack and unpack, plain jnp.

One token is 656 bytes, uint8[..., 656]:

- bytes 0..511: the 512 latent values as float8_e4m3fn, in four tiles of 128 values;
- bytes 512..527: four float32 scales (little-endian), one per tile,
  ``scale = 2 ** ceil(log2(max(amax / 448, 1e-4)))`` with ``amax = max |x|`` over the tile, so every
  scale is a power of two (at least 2**-13);
- bytes 528..655: the 64 RoPE values as bfloat16 (little-endian), not quantized.

A latent value dequantizes to ``float(e4m3) * scale``. mla_decode and update_kv_cache take a uint8
cache of such rows; the sizes come from the extension's table of limits (cuda/common/config.h), so
the kernels and this module agree on the layout.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from . import _validate
from ._validate import check_fp8_pack_rows, check_fp8_packed, check_fp8_unpack_dtype

LATENT = _validate.HEAD_DIM_V
ROPE = _validate.HEAD_DIM_QK - _validate.HEAD_DIM_V
TILE = _validate.FP8_TILE_COLS
TILES = LATENT // TILE
E4M3_MAX = 448.0
SCALE_FLOOR = 1e-4  # as float32, as FlashMLA computes it
ROW_BYTES = _validate.FP8_ROW_BYTES
# The layout this module writes must be the one the kernels read (latent bytes, scales, RoPE).
if (LATENT % TILE, _validate.FP8_SCALES_OFFSET, _validate.FP8_ROPE_OFFSET, ROW_BYTES) != \
        (0, LATENT, LATENT + 4 * TILES, LATENT + 4 * TILES + 2 * ROPE):
    raise ImportError("jax_mla._fp8: the extension's FP8 row layout differs from this module's")


def _ceil_pow2(y: jax.Array) -> jax.Array:
    """2 ** ceil(log2(y)) for positive float32 y, exactly (from the bits, no log2 rounding).
    NaN and +inf are returned as they are."""
    bits = lax.bitcast_convert_type(y, jnp.uint32)
    exponent = bits & jnp.uint32(0x7F800000)
    exact = (bits & jnp.uint32(0x007FFFFF)) == 0  # y is already a power of two (y is normal here)
    up = lax.bitcast_convert_type(exponent + jnp.uint32(0x00800000), jnp.float32)
    p = jnp.where(exact, y, up)
    return jnp.where(jnp.isfinite(y), p, y)


def _le_bytes(u: jax.Array, nbytes: int) -> jax.Array:
    """Unsigned ints [..., n] -> their little-endian bytes uint8[..., n * nbytes]."""
    parts = [((u >> (8 * i)) & 0xFF).astype(jnp.uint8) for i in range(nbytes)]
    return jnp.stack(parts, axis=-1).reshape(*u.shape[:-1], u.shape[-1] * nbytes)


def _from_le_bytes(b: jax.Array, nbytes: int, utype: Any) -> jax.Array:
    """uint8[..., n * nbytes] little-endian -> unsigned ints [..., n] of type utype."""
    b = b.reshape(*b.shape[:-1], b.shape[-1] // nbytes, nbytes).astype(utype)
    out = b[..., 0]
    for i in range(1, nbytes):
        out = out | (b[..., i] << (8 * i))
    return out


def pack_fp8_kv(rows: jax.Array) -> jax.Array:
    """Packs latent-cache rows into the FP8 format: [..., 576] bf16/fp16/f32 -> uint8[..., 656].

    Per tile of 128 latent values, in float32: ``amax = max |x|``,
    ``scale = 2 ** ceil(log2(max(amax / 448, 1e-4)))``, and each value is stored as
    ``float8_e4m3fn(clip(x / scale, -448, 448))`` (round to nearest even; the clip makes saturation
    explicit, as JAX's cast turns values past 464 into NaN). The 64 RoPE values are cast to bfloat16.
    Bit-exact and deterministic; plain jnp, so it works under jit, vmap and on any backend.

    Non-finite inputs: a NaN in a tile makes that tile's scale NaN and all its 128 values NaN; a
    +-inf (without NaN) makes the scale +inf, its finite values 0 and the infinities NaN. Either
    way every value of that tile unpacks to NaN; the other tiles are unaffected. The RoPE part
    keeps NaN/inf as bfloat16 does.
    """
    check_fp8_pack_rows(rows)
    rows = jnp.asarray(rows)
    lead = rows.shape[:-1]
    latent = rows[..., :LATENT].astype(jnp.float32).reshape(*lead, TILES, TILE)
    amax = jnp.max(jnp.abs(latent), axis=-1, keepdims=True)
    scale = _ceil_pow2(jnp.maximum(amax / jnp.float32(E4M3_MAX), jnp.float32(SCALE_FLOOR)))
    q = jnp.clip(latent / scale, -E4M3_MAX, E4M3_MAX).astype(jnp.float8_e4m3fn)
    q_bytes = lax.bitcast_convert_type(q, jnp.uint8).reshape(*lead, LATENT)
    scale_bytes = _le_bytes(lax.bitcast_convert_type(scale[..., 0], jnp.uint32), 4)
    rope = lax.bitcast_convert_type(rows[..., LATENT:].astype(jnp.bfloat16), jnp.uint16)
    rope_bytes = _le_bytes(rope.astype(jnp.uint32), 2)
    return jnp.concatenate([q_bytes, scale_bytes, rope_bytes], axis=-1)


def unpack_fp8_kv(packed: jax.Array, dtype: Any = jnp.float32) -> jax.Array:
    """Unpacks FP8 rows: uint8[..., 656] -> [..., 576] in dtype (float32, bfloat16 or float16).

    Latent values are ``float(e4m3) * scale``, computed in float32 (exact) then cast to dtype, which
    is exact for bfloat16 too unless out of its range; float16 can overflow or lose small values.
    The RoPE values are the stored bfloat16 values cast to dtype.
    """
    check_fp8_packed(packed)
    dt = check_fp8_unpack_dtype(dtype)
    packed = jnp.asarray(packed)
    lead = packed.shape[:-1]
    q = lax.bitcast_convert_type(packed[..., :LATENT], jnp.float8_e4m3fn).astype(jnp.float32)
    scale_bits = _from_le_bytes(packed[..., LATENT:LATENT + 4 * TILES], 4, jnp.uint32)
    scale = lax.bitcast_convert_type(scale_bits, jnp.float32)
    latent = (q.reshape(*lead, TILES, TILE) * scale[..., None]).reshape(*lead, LATENT)
    rope_bits = _from_le_bytes(packed[..., LATENT + 4 * TILES:], 2, jnp.uint16)
    rope = lax.bitcast_convert_type(rope_bits, jnp.bfloat16)
    return jnp.concatenate([latent.astype(dt), rope.astype(dt)], axis=-1)
