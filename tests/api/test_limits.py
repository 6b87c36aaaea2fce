"""One table of limits: cuda/runtime/limits.h, exported as jax_mla._ext.limits(). The Python checks
(jax_mla._validate, at trace time) take every bound from it, and the C++ handlers check the same
constants; these tests fail when the two sides disagree."""

from __future__ import annotations

import ast
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cases
import jax_mla
from jax_mla import _ext, _validate

NAMES = {"HEAD_DIM_QK", "HEAD_DIM_V", "MAX_SEQ_Q", "MAX_HEADS_Q", "BLOCK_M", "BLOCK_N", "MIN_GPU_PAGE_SIZE",
         "MAX_GPU_PAGE_SIZE", "PART_FIELDS", "COMBINE_HEADER", "MANY_SPLITS", "INVARIANT_FIELDS",
         "DEFAULT_INVARIANT_CHUNK", "MAX_INVARIANT_CHUNK", "INT32_MAX", "MAX_GPU_BATCH", "FP8_ROW_BYTES",
         "FP8_TILE_COLS", "FP8_SCALES_OFFSET", "FP8_ROPE_OFFSET"}


@pytest.fixture(autouse=True)
def on_cpu():
    with jax.default_device(jax.devices("cpu")[0]):
        yield


def test_table_contents():
    limits = _ext.limits()
    assert set(limits) == NAMES
    assert all(type(v) is int for v in limits.values())
    assert limits["INT32_MAX"] == 2**31 - 1
    assert limits["MIN_GPU_PAGE_SIZE"] <= limits["BLOCK_N"] <= limits["MAX_GPU_PAGE_SIZE"]
    # FlashMLA's V32 FP8 row: 512 e4m3 bytes, 4 float32 scales, 64 bfloat16 RoPE values.
    assert (limits["FP8_TILE_COLS"], limits["FP8_SCALES_OFFSET"], limits["FP8_ROPE_OFFSET"],
            limits["FP8_ROW_BYTES"]) == (128, 512, 528, 656)


def test_python_takes_every_limit_from_the_table():
    limits = _ext.limits()
    for name in NAMES - {"BLOCK_N", "INT32_MAX"}:
        assert getattr(_validate, name) == limits[name], name
    assert _validate._INT32_MAX == limits["INT32_MAX"]
    assert _validate.KERNELS == _ext.KERNELS
    assert _validate.FP8_KERNELS == tuple(_ext.FP8_KERNELS)
    assert jax_mla._fp8.ROW_BYTES == limits["FP8_ROW_BYTES"] and jax_mla._fp8.TILE == limits["FP8_TILE_COLS"]
    assert cases.BLOCK_N == limits["BLOCK_N"] and cases.HEAD_DIM_QK == limits["HEAD_DIM_QK"]


def test_validate_hard_codes_no_limit():
    """No module-level constant of jax_mla/_validate.py is a number written in the file."""
    tree = ast.parse(inspect.getsource(_validate))
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            value = node.value.value
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            assert not (isinstance(value, int) and not isinstance(value, bool)), (names, value)


def ffi_decode(q, kv, table, lens, num_parts=2):
    """The CPU handler, called below jax_mla's Python checks."""
    b, s_q, h_q, _ = q.shape
    results = (jax.ShapeDtypeStruct((b, s_q, h_q, _validate.HEAD_DIM_V), q.dtype),
               jax.ShapeDtypeStruct((b, s_q, h_q), jnp.float32))
    out, _ = jax.ffi.ffi_call("jax_mla_decode", results)(
        q, kv, table, lens, np.zeros((0,), np.int32), softmax_scale=np.float32(0.05), causal=False,
        num_parts=np.int32(num_parts), kernel=np.int32(0), chunk_blocks=np.int32(0))
    return np.asarray(out)


def inputs(s_q, h_q):
    q = np.zeros((1, s_q, h_q, _validate.HEAD_DIM_QK), jnp.bfloat16)
    kv = np.zeros((2, 16, _validate.HEAD_DIM_QK), jnp.bfloat16)
    return q, kv, np.zeros((1, 1), np.int32), np.full((1,), 5, np.int32)


@pytest.mark.parametrize("dim, name", [(1, "MAX_SEQ_Q"), (2, "MAX_HEADS_Q")])
def test_python_and_handler_agree_on_the_bound(dim, name):
    bound = _ext.limits()[name]
    for n, ok in ((bound, True), (bound + 1, False)):
        shape = [1, 1]
        shape[dim - 1] = n
        args = inputs(*shape)
        if ok:
            jax_mla.mla_decode(*args)
            ffi_decode(*args)
            continue
        with pytest.raises(ValueError, match=f"<= {bound} "):
            jax_mla.mla_decode(*args)
        with pytest.raises(Exception, match=rf"must be in \[1, {bound}\]"):
            ffi_decode(*args)


@pytest.mark.parametrize("width", [576, 655, 657])
def test_python_and_handler_agree_on_the_fp8_row(width):
    """A uint8 cache is the FP8 format: both sides want rows of FP8_ROW_BYTES and name kv_cache."""
    q, _, table, lens = inputs(1, 1)
    row = _ext.limits()["FP8_ROW_BYTES"]
    jax_mla.mla_decode(q, np.zeros((2, 16, row), np.uint8), table, lens)
    ffi_decode(q, np.zeros((2, 16, row), np.uint8), table, lens)
    bad = np.zeros((2, 16, width), np.uint8)
    with pytest.raises(ValueError, match=f"kv_cache .*last dimension {row}, got shape"):
        jax_mla.mla_decode(q, bad, table, lens)
    with pytest.raises(Exception, match=rf"kv_cache must have shape \(num_pages, page_size, {row}\) "
                                        rf"\(uint8: FP8 rows\)"):
        ffi_decode(q, bad, table, lens)


def test_handler_refuses_other_cache_dtypes():
    q, _, table, lens = inputs(1, 1)
    for dt in (np.float32, np.int8, jnp.float8_e4m3fn):
        kv = np.zeros((2, 16, _validate.HEAD_DIM_QK), dt)
        with pytest.raises(TypeError, match="kv_cache must have the same dtype as q"):
            jax_mla.mla_decode(q, kv, table, lens)
        with pytest.raises(Exception, match="kv_cache dtype .* differs from q dtype bfloat16 "
                                            r"\(or is uint8 for FP8 rows of 656 bytes\)"):
            ffi_decode(q, kv, table, lens)


def test_gpu_page_size_bounds():
    lo, hi = _ext.limits()["MIN_GPU_PAGE_SIZE"], _ext.limits()["MAX_GPU_PAGE_SIZE"]
    for ok in (lo, hi):
        _validate.check_gpu_page_size(ok)
    for bad in (lo // 2, hi * 2, lo + 1):
        with pytest.raises(ValueError, match=rf"\[{lo}, {hi}\]"):
            _validate.check_gpu_page_size(bad)
