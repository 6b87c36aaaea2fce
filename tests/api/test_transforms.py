"""jit, vmap, jax.export, grad and cross-platform lowering of jax_mla.mla_decode (on CPU)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cases
import jax_mla
from jax_mla import _ext


pytestmark = pytest.mark.usefixtures("on_cpu")  # jax's default device: the CPU (conftest.py)


def stack(datas):
    return [np.stack(xs) for xs in zip(*(d.args for d in datas))]


def assert_agree(got, want, dtype):
    """Two kernel results for the same problem, possibly split differently: fp32-close."""
    u = cases.UNIT_ROUNDOFF[dtype]
    got_out, got_lse = (np.asarray(x, np.float64) for x in got)
    want_out, want_lse = (np.asarray(x, np.float64) for x in want)
    assert np.isfinite(got_out).all()
    assert (np.abs(got_out - want_out) <= 2 * u * np.abs(want_out) + 1e-5).all()
    np.testing.assert_array_equal(np.isneginf(got_lse), np.isneginf(want_lse))
    fin = np.isfinite(want_lse)
    np.testing.assert_allclose(got_lse[fin], want_lse[fin], rtol=1e-5, atol=1e-5)


def decode(q, kv, bt, sl, schedule=None):
    return jax_mla.mla_decode(q, kv, bt, sl, causal=True, return_lse=True, schedule=schedule)


# Instances with the same shapes (same lens) but their own data and page permutations.
BASE = cases.Case(lens=(0, 5, 130, 64), s_q=2, h_q=3, page_size=16, causal=True, extra_pages=2,
                  extra_slots=1)
INSTANCES = [cases.make(BASE.replace(seed=300 + v)) for v in range(3)]


def per_instance(datas, shared_kv=None):
    res = []
    for d in datas:
        kv = d.kv_cache if shared_kv is None else shared_kv
        res.append(decode(d.q, kv, d.block_table, d.seq_lens))
    return [np.stack([np.asarray(r[i]) for r in res]) for i in range(2)]


# ----------------------------------------------------------------------------------------------
# jit
# ----------------------------------------------------------------------------------------------

def test_jit_with_schedule_shared_by_layers():
    data = INSTANCES[0]

    @jax.jit
    def two_layers(q, kv, bt, sl):
        sched = jax_mla.decode_schedule(sl, num_heads=3, seq_q=2)
        o1, _ = decode(q, kv, bt, sl, sched)
        o2, l2 = decode(q, kv, bt, sl, sched)
        return o1, o2, l2

    o1, o2, l2 = two_layers(*data.args)
    np.testing.assert_array_equal(np.asarray(o1), np.asarray(o2))
    ref = cases.reference(data)
    cases.assert_close_rounding_only(o2, l2, *ref, data.case.dtype, cases.max_abs_score(data))
    text = two_layers.lower(*data.args).as_text()
    assert text.count("@jax_mla_decode_schedule(") == 1 and text.count("@jax_mla_decode(") == 2


# ----------------------------------------------------------------------------------------------
# vmap
# ----------------------------------------------------------------------------------------------

def test_vmap_batched_cache():
    q, kv, bt, sl = stack(INSTANCES)
    got = jax.vmap(decode)(q, kv, bt, sl)
    want = per_instance(INSTANCES)
    assert got[0].shape == (3, 4, 2, 3, 512) and got[1].shape == (3, 4, 2, 3)
    assert_agree(got, want, BASE.dtype)
    for v, d in enumerate(INSTANCES):
        cases.assert_close_rounding_only(got[0][v], got[1][v], *cases.reference(d), BASE.dtype,
                                         cases.max_abs_score(d))


def test_vmap_shared_cache():
    # All instances read one cache: give each its own block table into the first instance's pages.
    shared = INSTANCES[0]
    datas = []
    for v in range(3):
        d = cases.make(BASE.replace(seed=310 + v))
        d.kv_cache, d.block_table, d.dense_kv = shared.kv_cache, shared.block_table, shared.dense_kv
        d.block_table = np.roll(shared.block_table, v, axis=0)
        d.seq_lens = np.roll(shared.seq_lens, v)
        d.dense_kv = [shared.dense_kv[(r - v) % 4] for r in range(4)]
        datas.append(d)
    q = np.stack([d.q for d in datas])
    bt = np.stack([d.block_table for d in datas])
    sl = np.stack([d.seq_lens for d in datas])
    got = jax.vmap(decode, in_axes=(0, None, 0, 0))(q, shared.kv_cache, bt, sl)
    assert_agree(got, per_instance(datas, shared_kv=shared.kv_cache), BASE.dtype)


def test_vmap_only_cache_batched_and_axis_not_first():
    q0, kv0, bt, sl = INSTANCES[0].args
    # Caches with the same page layout (and poison) but other values: kv0 * 2^-v, exact in bf16.
    caches = [(kv0.astype(np.float32) * 2.0 ** -v).astype(kv0.dtype) for v in range(3)]
    kv = np.stack(caches, axis=2)  # vmapped axis in the middle
    got = jax.vmap(decode, in_axes=(None, 2, None, None))(q0, kv, bt, sl)
    want = [decode(q0, c, bt, sl) for c in caches]
    want = [np.stack([np.asarray(w[i]) for w in want]) for i in range(2)]
    assert not np.array_equal(want[1][0], want[1][1])
    assert_agree(got, want, BASE.dtype)


def test_vmap_drops_a_passed_schedule_and_nests():
    q, kv, bt, sl = stack(INSTANCES)
    scheds = jax.vmap(lambda s: jax_mla.decode_schedule(s, num_heads=3, seq_q=2, num_parts=5))(sl)
    for v in range(3):
        np.testing.assert_array_equal(np.asarray(scheds[v]), _ext.testing.plan_schedule(sl[v], 5))
    got = jax.vmap(decode)(q, kv, bt, sl, scheds)
    assert_agree(got, per_instance(INSTANCES), BASE.dtype)
    # Two levels of vmap: (2, 3) instances.
    q2, kv2, bt2, sl2 = (np.stack([x, x[::-1]]) for x in (q, kv, bt, sl))
    got2 = jax.jit(jax.vmap(jax.vmap(decode)))(q2, kv2, bt2, sl2)
    assert_agree([g[0] for g in got2], got, BASE.dtype)
    assert_agree([g[1][::-1] for g in got2], got, BASE.dtype)


def test_vmap_keeps_invalid_page_ids_invalid():
    q, kv, bt, sl = stack(INSTANCES)
    bt = bt.copy()
    bt[1, 2, 0] = -1  # request 2 of instance 1 reads page -1: must not become instance 0's page
    with pytest.raises(Exception, match="block_table|page"):
        jax.block_until_ready(jax.vmap(decode)(q, kv, bt, sl))


# ----------------------------------------------------------------------------------------------
# jax.export
# ----------------------------------------------------------------------------------------------

def test_export_round_trip():
    data = INSTANCES[1]
    fn = jax.jit(lambda q, kv, bt, sl: decode(q, kv, bt, sl))
    exp = jax.export.export(fn, disabled_checks=jax_mla.export_disabled_checks())(*data.args)
    blob = exp.serialize()
    restored = jax.export.deserialize(blob)
    got = restored.call(*data.args)
    want = fn(*data.args)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_export_for_cpu_and_cuda_runs_on_cpu():
    data = INSTANCES[2]
    fn = jax.jit(lambda q, kv, bt, sl: decode(q, kv, bt, sl,
                                              jax_mla.decode_schedule(sl, num_heads=3, seq_q=2)))
    exp = jax.export.export(fn, platforms=("cpu", "cuda"),
                            disabled_checks=jax_mla.export_disabled_checks())(*data.args)
    assert exp.platforms == ("cpu", "cuda")
    restored = jax.export.deserialize(exp.serialize())
    got = restored.call(*data.args)
    cases.assert_close_rounding_only(*got, *cases.reference(data), BASE.dtype,
                                     cases.max_abs_score(data))


def test_export_needs_the_disabled_checks():
    data = INSTANCES[0]
    with pytest.raises(ValueError, match="jax_mla_decode"):
        jax.export.export(jax.jit(decode))(*data.args)
    names = {str(c) for c in jax_mla.export_disabled_checks()}
    assert names == {"custom_call:jax_mla_decode", "custom_call:jax_mla_decode_schedule",
                     "custom_call:jax_mla_decode_sparse"}


# ----------------------------------------------------------------------------------------------
# No gradient
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["grad", "jit_grad", "vjp", "jvp"])
def test_gradient_raises_clear_error(how):
    q, kv, bt, sl = INSTANCES[0].args
    q = jnp.asarray(q)

    def loss(q):
        return jnp.sum(jax_mla.mla_decode(q, kv, bt, sl).astype(jnp.float32))

    with pytest.raises(NotImplementedError, match="mla_decode is inference-only; it has no gradient"):
        if how == "grad":
            jax.grad(loss)(q)
        elif how == "jit_grad":
            jax.jit(jax.grad(loss))(q)
        elif how == "vjp":
            jax.vjp(loss, q)
        else:
            jax.jvp(loss, (q,), (jnp.ones_like(q),))


def test_stop_gradient_makes_it_usable_in_differentiated_code():
    q, kv, bt, sl = INSTANCES[0].args
    w = jnp.float32(2.0)

    def loss(w):
        out = jax_mla.mla_decode(jax.lax.stop_gradient(jnp.asarray(q)), kv, bt, sl)
        return w * jnp.sum(out.astype(jnp.float32))

    g = jax.grad(loss)(w)
    assert np.isfinite(float(g))


# ----------------------------------------------------------------------------------------------
# Lowering for CUDA on a machine without a GPU
# ----------------------------------------------------------------------------------------------

def lowered_text(platform, *args, fn=decode):
    return jax.jit(fn).trace(*args).lower(lowering_platforms=(platform,)).as_text()


def test_cuda_lowering_on_cpu_machine():
    data = INSTANCES[0]
    text = lowered_text("cuda", *data.args)
    calls = [ln for ln in text.splitlines() if "@jax_mla_decode(" in ln]
    assert len(calls) == 1
    call = calls[0]
    # out, lse and the workspace (u8) whose size the extension module defines.
    b, s_q, h_q = BASE.b, BASE.s_q, BASE.h_q
    num_parts = int(re.search(r"num_parts = (\d+) : i32", call).group(1))
    ws = _ext.workspace_bytes(b, s_q * h_q, num_parts)
    assert re.search(rf"-> \(tensor<{b}x{s_q}x{h_q}x512xbf16>, tensor<{b}x{s_q}x{h_q}xf32>, "
                     rf"tensor<{ws}xui8>\)", call), call
    assert "causal = true" in call and re.search(r"softmax_scale = [0-9.e+-]+ : f32", call)
    assert "kernel = 0 : i32" in call  # "auto"
    sched_text = lowered_text("cuda", data.seq_lens,
                              fn=lambda sl: jax_mla.decode_schedule(sl, num_heads=16))
    assert "@jax_mla_decode_schedule(" in sched_text


def test_cpu_lowering_has_no_workspace():
    data = INSTANCES[0]
    call = next(ln for ln in lowered_text("cpu", *data.args).splitlines() if "@jax_mla_decode(" in ln)
    assert "ui8" not in call and "tensor<4x2x3xf32>" in call
    # An absent schedule travels as an empty int32 array.
    assert "tensor<0xi32>" in call


@pytest.mark.parametrize("page", [1, 8, 48, 512])
def test_cuda_lowering_rejects_unsupported_page_size(page):
    data = cases.make(BASE.replace(page_size=page, seed=320))
    with pytest.raises(ValueError, match=f"power-of-two page_size in \\[16, 256\\].*got page_size = {page}"):
        lowered_text("cuda", *data.args)
    lowered_text("cpu", *data.args)  # the CPU kernel takes any page size


@pytest.mark.parametrize("page", [16, 32, 64, 128, 256])
def test_cuda_lowering_accepts_gpu_page_sizes(page):
    data = cases.make(BASE.replace(page_size=page, seed=321))
    assert "@jax_mla_decode(" in lowered_text("cuda", *data.args)


@pytest.mark.parametrize("kernel, attr", sorted(_ext.KERNELS.items()))
def test_kernel_argument_reaches_the_custom_call(kernel, attr):
    """The static kernel argument is the int32 attribute "kernel" of both lowerings, under jit,
    vmap (folded into the batch) and in an exported module."""
    data = INSTANCES[0]

    def fn(q, kv, bt, sl):
        return jax_mla.mla_decode(q, kv, bt, sl, causal=True, return_lse=True, kernel=kernel)

    def attrs(text):
        return re.findall(r"kernel = (-?\d+) : i32", "\n".join(
            ln for ln in text.splitlines() if "@jax_mla_decode(" in ln))

    for platform in ("cuda", "cpu"):
        assert attrs(lowered_text(platform, *data.args, fn=fn)) == [str(attr)]
        stacked = stack(INSTANCES)
        assert attrs(lowered_text(platform, *stacked, fn=jax.vmap(fn))) == [str(attr)]
    exp = jax.export.export(jax.jit(fn), platforms=("cpu", "cuda"),
                            disabled_checks=jax_mla.export_disabled_checks())(*data.args)
    assert attrs(exp.mlir_module()) == [str(attr)] * 2  # one custom call per platform branch
    got = jax.export.deserialize(exp.serialize()).call(*data.args)  # runs on the CPU
    want = fn(*data.args)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
