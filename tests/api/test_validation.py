"""Bad inputs raise the right exception type with a message naming the argument."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mla
from jax_mla._primitive import mla_decode_p

BF16 = jnp.bfloat16


pytestmark = pytest.mark.usefixtures("on_cpu")  # jax's default device: the CPU (conftest.py)


def good(b=2, s_q=1, h_q=16, num_pages=10, page=64, max_pages=4):
    q = np.zeros((b, s_q, h_q, 576), BF16)
    kv = np.zeros((num_pages, page, 576), BF16)
    bt = np.arange(b * max_pages, dtype=np.int32).reshape(b, max_pages) % num_pages
    sl = np.full((b,), 70, np.int32)
    return q, kv, bt, sl


def call(q, kv, bt, sl, **kw):
    return jax_mla.mla_decode(q, kv, bt, sl, **kw)


def test_good_inputs_pass():
    out = call(*good())
    assert out.shape == (2, 1, 16, 512)


def test_message_format_example():
    q, kv, bt, sl = good()
    kv = np.zeros((10, 64, 512), BF16)
    with pytest.raises(ValueError) as e:
        call(q, kv, bt, sl)
    assert str(e.value) == "mla_decode: kv_cache must have last dimension 576, got shape (10, 64, 512)"


def _replace(i, value):
    args = list(good())
    args[i] = value
    return args


SHAPE_ERRORS = [
    # (id, argument index, bad value, expected words in the message)
    ("q_rank3", 0, np.zeros((2, 16, 576), BF16), ["q", "(2, 16, 576)", "rank 4"]),
    ("q_dim512", 0, np.zeros((2, 1, 16, 512), BF16), ["q", "576", "(2, 1, 16, 512)"]),
    ("q_sq9", 0, np.zeros((2, 9, 16, 576), BF16), ["q", "s_q", "8", "9"]),
    ("q_sq0", 0, np.zeros((2, 0, 16, 576), BF16), ["q", "s_q", "0"]),
    ("q_hq129", 0, np.zeros((2, 1, 129, 576), BF16), ["q", "h_q", "128", "129"]),
    ("q_hq0", 0, np.zeros((2, 1, 0, 576), BF16), ["q", "h_q"]),
    ("q_b0", 0, np.zeros((0, 1, 16, 576), BF16), ["q", "b >= 1"]),
    ("kv_rank2", 1, np.zeros((640, 576), BF16), ["kv_cache", "(640, 576)"]),
    ("kv_dim512", 1, np.zeros((10, 64, 512), BF16), ["kv_cache", "576", "(10, 64, 512)"]),
    ("kv_rank4_heads2", 1, np.zeros((10, 64, 2, 576), BF16), ["kv_cache", "(10, 64, 2, 576)"]),
    ("kv_no_pages", 1, np.zeros((0, 64, 576), BF16), ["kv_cache", "page"]),
    ("kv_page0", 1, np.zeros((10, 0, 576), BF16), ["kv_cache", "page_size"]),
    ("bt_rank1", 2, np.zeros((8,), np.int32), ["block_table", "(8,)"]),
    ("bt_wrong_b", 2, np.zeros((3, 4), np.int32), ["block_table", "(3, 4)", "b"]),
    ("bt_no_columns", 2, np.zeros((2, 0), np.int32), ["block_table", "(2, 0)"]),
    ("sl_rank2", 3, np.zeros((2, 1), np.int32), ["seq_lens", "(2, 1)"]),
    ("sl_wrong_b", 3, np.zeros((3,), np.int32), ["seq_lens", "(3,)", "(2,)"]),
]


@pytest.mark.parametrize("i,value,words", [c[1:] for c in SHAPE_ERRORS], ids=[c[0] for c in SHAPE_ERRORS])
def test_shape_errors(i, value, words):
    args = _replace(i, value)
    with pytest.raises(ValueError) as e:
        call(*args)
    msg = str(e.value)
    assert msg.startswith("mla_decode: ")
    for w in words:
        assert w in msg, (w, msg)
    # The same check runs in abstract evaluation, i.e. also under jit (traced arguments).
    with pytest.raises(ValueError, match=re.escape(words[0])):
        jax.jit(call)(*args)


DTYPE_ERRORS = [
    ("q_f32", 0, np.zeros((2, 1, 16, 576), np.float32), ["q", "bfloat16 or float16", "float32"]),
    ("kv_f16_vs_bf16", 1, np.zeros((10, 64, 576), np.float16), ["kv_cache", "bfloat16", "float16"]),
    ("bt_int64", 2, np.zeros((2, 4), np.int64), ["block_table", "int32", "int64"]),
    ("bt_uint32", 2, np.zeros((2, 4), np.uint32), ["block_table", "int32", "uint32"]),
    ("bt_list", 2, [[0, 1, 2, 3], [4, 5, 6, 7]], ["block_table", "int32", "int64"]),
    ("sl_int64", 3, np.full((2,), 5, np.int64), ["seq_lens", "int32", "int64"]),
    ("sl_f32", 3, np.full((2,), 5, np.float32), ["seq_lens", "int32", "float32"]),
]


@pytest.mark.parametrize("i,value,words", [c[1:] for c in DTYPE_ERRORS], ids=[c[0] for c in DTYPE_ERRORS])
def test_dtype_errors(i, value, words):
    args = _replace(i, value)
    with pytest.raises(TypeError) as e:
        call(*args)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_int64_numpy_table_is_not_silently_cast():
    # jnp.asarray would quietly turn an int64 NumPy table into int32 without x64: we refuse first.
    q, kv, bt, sl = good()
    with pytest.raises(TypeError, match="block_table must have dtype int32, got int64"):
        call(q, kv, bt.astype(np.int64), sl)


@pytest.mark.parametrize("lens,words", [
    ([70, 257], ["seq_lens", "4 * 64 = 256", "seq_lens[1] = 257", "block_table"]),
    ([-1, 3], ["seq_lens", "seq_lens[0] = -1"]),
])
def test_concrete_seq_lens_checked_at_call_time(lens, words):
    q, kv, bt, _ = good()
    with pytest.raises(ValueError) as e:
        call(q, kv, bt, np.asarray(lens, np.int32))
    for w in words:
        assert w in str(e.value), (w, str(e.value))
    # Also for concrete jax arrays.
    with pytest.raises(ValueError, match="seq_lens"):
        call(q, kv, bt, jnp.asarray(lens, jnp.int32))


def test_concrete_block_table_ids_checked_at_call_time():
    q, kv, bt, sl = good()
    bt = bt.copy()
    bt[1, 1] = 10  # request 1 (70 tokens) reads 2 pages: entry 1 is read
    with pytest.raises(ValueError, match=re.escape("block_table[1, 1] = 10")):
        call(q, kv, bt, sl)
    bt[1, 1] = 0
    bt[1, 3] = -5  # not read (past the request's pages): fine
    call(q, kv, bt, sl)


# The CPU handler returns an INVALID_ARGUMENT ffi error. jaxlib raises it as JaxRuntimeError, or,
# on some dispatch paths (seen with jax 0.10.2 when the call executes synchronously), as ValueError.
RUNTIME_ERRORS = (jax.errors.JaxRuntimeError, ValueError)


def test_seq_lens_exceeding_table_under_jit_is_a_runtime_error():
    q, kv, bt, _ = good()
    sl = np.array([70, 300], np.int32)  # 300 > 4 pages * 64
    with pytest.raises(RUNTIME_ERRORS, match="INVALID_ARGUMENT: jax_mla_decode: seq_lens"):
        jax.block_until_ready(jax.jit(call)(q, kv, bt, sl))


def test_bad_page_id_under_jit_is_a_runtime_error():
    q, kv, bt, sl = good()
    bt = bt.copy()
    bt[0, 1] = 99
    with pytest.raises(RUNTIME_ERRORS, match=r"INVALID_ARGUMENT: jax_mla_decode: block_table\[0, 1\] = 99"):
        jax.block_until_ready(jax.jit(call)(q, kv, bt, sl))


@pytest.mark.parametrize("scale,exc,words", [
    ("0.1", TypeError, ["softmax_scale", "str"]),
    (True, TypeError, ["softmax_scale", "bool"]),
    (jnp.float32(0.1), TypeError, ["softmax_scale", "static"]),
    (float("nan"), ValueError, ["softmax_scale", "finite"]),
    (1e300, ValueError, ["softmax_scale", "finite"]),
    (-0.1, ValueError, ["softmax_scale", "positive"]),
    (0.0, ValueError, ["softmax_scale", "positive"]),
    (1e-50, ValueError, ["softmax_scale", "positive"]),  # 0 in float32
])
def test_bad_softmax_scale(scale, exc, words):
    with pytest.raises(exc) as e:
        call(*good(), softmax_scale=scale)
    for w in words:
        assert w in str(e.value)


def test_numpy_scales_accepted():
    a = call(*good(), softmax_scale=np.float32(0.125))
    b = call(*good(), softmax_scale=np.array(0.125))
    c = call(*good(), softmax_scale=0.125)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(c))
    np.testing.assert_array_equal(np.asarray(b), np.asarray(c))


def test_traced_softmax_scale_is_rejected():
    with pytest.raises(TypeError, match="softmax_scale must be a static"):
        jax.jit(lambda s: call(*good(), softmax_scale=s))(0.1)


@pytest.mark.parametrize("name,value", [("causal", 1), ("causal", "yes"), ("return_lse", None)])
def test_bool_flags(name, value):
    with pytest.raises(TypeError, match=f"{name} must be a Python bool"):
        call(*good(), **{name: value})


def test_bad_schedule():
    q, kv, bt, sl = good()
    # b = 2: a schedule has num_parts * 8 + 2 * 2 + 3 elements.
    with pytest.raises(ValueError, match=r"schedule must have shape \(num_parts \* 8 \+ 2 \* b \+ 3,\)"):
        call(q, kv, bt, sl, schedule=np.zeros((12,), np.int32))   # 12 - 7 is not a multiple of 8
    with pytest.raises(ValueError, match="schedule"):
        call(q, kv, bt, sl, schedule=np.zeros((7,), np.int32))    # num_parts would be 0
    with pytest.raises(ValueError, match="schedule"):
        call(q, kv, bt, sl, schedule=np.zeros((15, 1), np.int32))
    with pytest.raises(TypeError, match="schedule must have dtype int32"):
        call(q, kv, bt, sl, schedule=np.zeros((15,), np.int64))
    # A schedule for a different batch size.
    other = jax_mla.decode_schedule(np.zeros(3, np.int32), num_heads=16, num_parts=4)
    with pytest.raises(ValueError, match="schedule"):
        call(q, kv, bt, sl, schedule=other)


@pytest.mark.parametrize("kw,exc,words", [
    (dict(num_heads=0), ValueError, ["num_heads", "[1, 128]", "0"]),
    (dict(num_heads=129), ValueError, ["num_heads", "129"]),
    (dict(num_heads=16, seq_q=9), ValueError, ["seq_q", "[1, 8]", "9"]),
    (dict(num_heads=16, num_parts=0), ValueError, ["num_parts", "0"]),
    (dict(num_heads=16, num_parts=2.0), TypeError, ["num_parts", "float"]),
    (dict(num_heads=16.0), TypeError, ["num_heads", "float"]),
])
def test_decode_schedule_arguments(kw, exc, words):
    with pytest.raises(exc) as e:
        jax_mla.decode_schedule(np.zeros(2, np.int32), **kw)
    assert str(e.value).startswith("decode_schedule: ")
    for w in words:
        assert w in str(e.value)


def test_decode_schedule_seq_lens():
    with pytest.raises(TypeError, match="seq_lens must have dtype int32, got int64"):
        jax_mla.decode_schedule(np.zeros(2, np.int64), num_heads=16)
    with pytest.raises(ValueError, match=r"seq_lens must have shape \(b,\)"):
        jax_mla.decode_schedule(np.zeros((2, 2), np.int32), num_heads=16)
    with pytest.raises(ValueError, match=r"seq_lens\[1\] = -3"):
        jax_mla.decode_schedule(np.array([0, -3], np.int32), num_heads=16)


def test_primitive_bound_directly_is_checked_too():
    q, kv, bt, sl = good()
    with pytest.raises(ValueError, match="kv_cache must have last dimension 576"):
        mla_decode_p.bind(jnp.asarray(q), jnp.zeros((10, 64, 512), BF16), jnp.asarray(bt),
                          jnp.asarray(sl), jnp.zeros((0,), jnp.int32), softmax_scale=0.1,
                          causal=False, num_parts=4, kernel="auto")
    with pytest.raises(ValueError, match="schedule"):
        mla_decode_p.bind(*(jnp.asarray(x) for x in (q, kv, bt, sl)), jnp.zeros((5,), jnp.int32),
                          softmax_scale=0.1, causal=False, num_parts=4, kernel="auto")
    with pytest.raises(ValueError, match="kernel must be one of"):
        mla_decode_p.bind(*(jnp.asarray(x) for x in (q, kv, bt, sl)), jnp.zeros((0,), jnp.int32),
                          softmax_scale=0.1, causal=False, num_parts=4, kernel="sm80")


# ----------------------------------------------------------------------------------------------
# FP8 caches (uint8 rows of 656 bytes): the dtype picks the format
# ----------------------------------------------------------------------------------------------

U8 = np.uint8


def good_fp8(q_dtype=BF16, rank4=False):
    q, _, bt, sl = good()
    kv = np.zeros((10, 64, 1, 656) if rank4 else (10, 64, 656), U8)
    return q.astype(q_dtype), kv, bt, sl


@pytest.mark.parametrize("q_dtype", [BF16, np.float16])
@pytest.mark.parametrize("rank4", [False, True])
def test_fp8_cache_accepted(q_dtype, rank4):
    out = call(*good_fp8(q_dtype, rank4))
    assert out.shape == (2, 1, 16, 512) and out.dtype == np.dtype(q_dtype)
    out = jax.jit(call)(*good_fp8(q_dtype, rank4))
    assert out.dtype == np.dtype(q_dtype)


FP8_ERRORS = [
    # (id, q dtype, cache, exception, words)
    ("u8_576", BF16, np.zeros((10, 64, 576), U8), ValueError,
     ["kv_cache", "uint8", "FP8", "last dimension 656", "(10, 64, 576)"]),
    ("u8_655", np.float16, np.zeros((10, 64, 655), U8), ValueError, ["kv_cache", "656", "(10, 64, 655)"]),
    ("u8_rank4_heads2", BF16, np.zeros((10, 64, 2, 656), U8), ValueError,
     ["kv_cache", "(num_pages, page_size, 1, 656)", "(10, 64, 2, 656)"]),
    ("u8_rank2", BF16, np.zeros((640, 656), U8), ValueError, ["kv_cache", "656", "(640, 656)"]),
    ("bf16_656", BF16, np.zeros((10, 64, 656), BF16), ValueError,
     ["kv_cache", "last dimension 576", "(10, 64, 656)", "must have dtype uint8"]),
    ("f32_cache", BF16, np.zeros((10, 64, 576), np.float32), TypeError,
     ["kv_cache", "same dtype as q (bfloat16)", "float32", "uint8", "pack_fp8_kv"]),
    ("e4m3_cache", BF16, np.zeros((10, 64, 576), jnp.float8_e4m3fn), TypeError,
     ["kv_cache", "float8_e4m3fn", "uint8 for FP8 rows of 656 bytes"]),
    ("int8_cache", np.float16, np.zeros((10, 64, 656), np.int8), ValueError,
     ["kv_cache", "last dimension 576"]),
    ("q_f32", np.float32, np.zeros((10, 64, 656), U8), TypeError, ["q", "bfloat16 or float16", "float32"]),
    ("q_u8", U8, np.zeros((10, 64, 656), U8), TypeError, ["q", "bfloat16 or float16", "uint8"]),
]


@pytest.mark.parametrize("q_dtype,kv,exc,words", [c[1:] for c in FP8_ERRORS], ids=[c[0] for c in FP8_ERRORS])
def test_fp8_cache_errors(q_dtype, kv, exc, words):
    q, _, bt, sl = good()
    q = q.astype(q_dtype)
    with pytest.raises(exc) as e:
        call(q, kv, bt, sl)
    assert str(e.value).startswith("mla_decode: ")
    for w in words:
        assert w in str(e.value), (w, str(e.value))
    with pytest.raises(exc, match=re.escape(words[0])):  # the same under jit
        jax.jit(call)(q, kv, bt, sl)


def test_fp8_primitive_bound_directly_is_checked_too():
    q, kv, bt, sl = good_fp8()
    with pytest.raises(ValueError, match="uint8 kv_cache holds FP8 rows .* last dimension 656"):
        mla_decode_p.bind(jnp.asarray(q), jnp.zeros((10, 64, 576), U8), jnp.asarray(bt),
                          jnp.asarray(sl), jnp.zeros((0,), jnp.int32), softmax_scale=0.1,
                          causal=False, num_parts=4, kernel="auto")
    with pytest.raises(ValueError, match=r"rank 3 \(num_pages, page_size, 656\)"):
        mla_decode_p.bind(jnp.asarray(q), jnp.asarray(kv).reshape(10, 64, 1, 656), jnp.asarray(bt),
                          jnp.asarray(sl), jnp.zeros((0,), jnp.int32), softmax_scale=0.1,
                          causal=False, num_parts=4, kernel="auto")


@pytest.mark.parametrize("kernel", ["auto", "sm90", "sm100", "portable"])
def test_fp8_cache_on_cuda_only_reaches_kernels_that_read_it(kernel):
    """Lowering for CUDA (no GPU needed) refuses, at trace time, an FP8 cache for a kernel that does
    not read the format (_ext.FP8_KERNELS, the handler's own table), naming the kernel; "auto" is
    refused only when no kernel reads it. The 16-bit cache lowers for every kernel."""
    fn = jax.jit(lambda *a: call(*a, kernel=kernel))
    fn.trace(*good()).lower(lowering_platforms=("cuda",))
    traced = fn.trace(*good_fp8())
    readers = jax_mla._validate.FP8_KERNELS
    ok = kernel in readers or (kernel == "auto" and readers)
    if ok:
        text = traced.lower(lowering_platforms=("cuda",)).as_text()
        assert "jax_mla_decode" in text and "656xui8" in text
        return
    with pytest.raises(ValueError) as e:
        traced.lower(lowering_platforms=("cuda",))
    msg = str(e.value)
    assert msg.startswith("mla_decode: ") and "FP8 kv_cache" in msg and "656" in msg, msg
    if kernel != "auto":
        assert f"kernel {kernel!r} does not read" in msg, msg
    # The CPU lowering of the same call is fine whatever the kernel argument.
    traced.lower(lowering_platforms=("cpu",))
