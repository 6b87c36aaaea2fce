"""mla_decode_sparse's API: argument checks (trace time, naming the argument), the CUDA lowering
(no GPU needed) and its limits, no gradient (the reference is differentiable), jax.export run in a
fresh process."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mla

pytestmark = pytest.mark.usefixtures("on_cpu")
TESTS = os.path.dirname(os.path.abspath(__file__))


def inputs(seed=0, b=2, s_q=2, h_q=16, topk=8, pages=4, page_size=16):
    rng = np.random.default_rng(seed)
    q = jnp.asarray(rng.standard_normal((b, s_q, h_q, 576)), jnp.bfloat16)
    kv = jnp.asarray(rng.standard_normal((pages, page_size, 576)), jnp.bfloat16)
    idx = jnp.asarray(rng.integers(-1, pages * page_size, (b, s_q, topk)), jnp.int32)
    return q, kv, idx


@pytest.mark.parametrize("change, exc, match", [
    (dict(q=np.zeros((2, 2, 16, 512), jnp.bfloat16)), ValueError, "q must have shape"),
    (dict(q=np.zeros((2, 2, 16, 576), np.float32)), TypeError, "q must have dtype"),
    (dict(q=np.zeros((2, 9, 16, 576), jnp.bfloat16)), ValueError, "s_q"),
    (dict(kv_cache=np.zeros((4, 16, 576), np.float16)), TypeError, "kv_cache"),
    (dict(kv_cache=np.zeros((4, 16, 600), jnp.bfloat16)), ValueError, "kv_cache"),
    (dict(indices=np.zeros((2, 2, 8), np.int64)), TypeError, "indices must have dtype int32"),
    (dict(indices=np.zeros((2, 1, 8), np.int32)), ValueError, "indices must have shape"),
    (dict(indices=np.zeros((2, 2, 0), np.int32)), ValueError, "indices must have shape"),
    (dict(topk_length=np.zeros((3,), np.int32)), ValueError, "topk_length must have shape"),
    (dict(topk_length=np.zeros((2,), np.int64)), TypeError, "topk_length must have dtype"),
    (dict(topk_length=np.array([9, 0], np.int32)), ValueError, r"topk_length\[0\] = 9"),
    (dict(topk_length=np.array([0, -1], np.int32)), ValueError, r"topk_length\[1\] = -1"),
    (dict(attn_sink=np.zeros((8,), np.float32)), ValueError, "attn_sink must have shape"),
    (dict(attn_sink=np.zeros((2, 16), np.float32)), ValueError, "attn_sink must have shape"),
    (dict(attn_sink=np.zeros((16,), np.float16)), TypeError, "attn_sink must have dtype float32"),
    (dict(softmax_scale=-1.0), ValueError, "softmax_scale"),
    (dict(return_lse=1), TypeError, "return_lse"),
])
def test_argument_errors(change, exc, match):
    q, kv, idx = inputs()
    kw = dict(q=q, kv_cache=kv, indices=idx)
    kw.update(change)
    pos = [kw.pop(k) for k in ("q", "kv_cache", "indices")]
    with pytest.raises(exc, match=match) as e:
        jax_mla.mla_decode_sparse(*pos, **kw)
    assert "mla_decode_sparse" in str(e.value)


def test_shape_errors_also_under_jit():
    q, kv, idx = inputs()
    with pytest.raises(ValueError, match="indices must have shape"):
        jax.jit(jax_mla.mla_decode_sparse)(q, kv, idx[:, :1])


def export_for_cuda(*args, **kw):
    return jax.export.export(jax.jit(lambda *a: jax_mla.mla_decode_sparse(*a, **kw)), platforms=("cuda",),
                             disabled_checks=jax_mla.export_disabled_checks())(*args)


@pytest.mark.parametrize("page_size", [16, 3, 1])
def test_cuda_lowering_is_one_custom_call_with_a_workspace(page_size):
    """Lowering for CUDA needs no GPU: one jax_mla_decode_sparse call with the plan's num_parts and a
    workspace result of sparse_workspace_bytes (the dense decode's over b * s_q one-token requests,
    then the compacted block table); any page size (the GPU sees pages of one token)."""
    q, kv, idx = inputs(page_size=page_size)
    text = export_for_cuda(q, kv, idx, topk_length=np.array([8, 3], np.int32),
                           attn_sink=np.zeros((16,), np.float32)).mlir_module()
    assert text.count("@jax_mla_decode_sparse") == 1, text
    num_parts = jax_mla._api.default_num_parts(1, 16)
    assert f"num_parts = {num_parts} : i32" in text
    nbytes = jax_mla._ext.sparse_workspace_bytes(2 * 2, 16, 8, num_parts)
    assert f"tensor<{nbytes}xui8>" in text


def test_cuda_lowering_limits():
    S = jax.ShapeDtypeStruct
    kv = S((4, 16, 576), jnp.bfloat16)
    ok = (S((8192, 2, 16, 576), jnp.bfloat16), kv, S((8192, 2, 4), jnp.int32))  # b * s_q = 16384
    assert "jax_mla_decode_sparse" in export_for_cuda(*ok).mlir_module()
    too_many = (S((8193, 2, 16, 576), jnp.bfloat16), kv, S((8193, 2, 4), jnp.int32))
    with pytest.raises(ValueError, match=r"mla_decode_sparse: on CUDA, b \* s_q = 8193 \* 2 = 16386 query tokens"):
        export_for_cuda(*too_many)
    # The CPU takes it.
    jax.export.export(jax.jit(jax_mla.mla_decode_sparse), platforms=("cpu",),
                      disabled_checks=jax_mla.export_disabled_checks())(*too_many)
    # An FP8 cache on CUDA: only while the portable kernel reads it (kernel_select.h kReadsFp8Cache).
    fp8 = (ok[0], S((4, 16, 656), jnp.uint8), ok[2])
    if "portable" in jax_mla._validate.FP8_KERNELS:
        assert "jax_mla_decode_sparse" in export_for_cuda(*fp8).mlir_module()
    else:
        with pytest.raises(ValueError, match="portable kernel .* does not read an FP8 kv_cache"):
            export_for_cuda(*fp8)


def test_no_gradient_but_the_reference_has_one():
    q, kv, idx = inputs()
    f = lambda q: jax_mla.mla_decode_sparse(q, kv, idx).astype(jnp.float32).sum()  # noqa: E731
    with pytest.raises(NotImplementedError, match="inference-only"):
        jax.grad(f)(q)
    qf = q.astype(jnp.float32)
    kvf = kv.astype(jnp.float32)
    sink = jnp.zeros((16,), jnp.float32)
    g = jax.grad(lambda q, s: jax_mla.reference.mla_decode_sparse_reference(
        q, kvf, idx, attn_sink=s)[0].sum(), argnums=(0, 1))(qf, sink)
    assert all(np.isfinite(np.asarray(x)).all() for x in g)
    # Finite-difference check of d/dq on one element.
    fn = lambda q: jax_mla.reference.mla_decode_sparse_reference(q, kvf, idx, attn_sink=sink)[0].sum()  # noqa
    e = jnp.zeros_like(qf).at[0, 0, 0, 0].set(1e-2)
    fd = (fn(qf + e) - fn(qf - e)) / 2e-2
    np.testing.assert_allclose(float(g[0][0, 0, 0, 0]), float(fd), rtol=2e-2, atol=2e-3)


def sparse_step(q, kv_cache, indices, topk_length, attn_sink):
    return jax_mla.mla_decode_sparse(q, kv_cache, indices, topk_length=topk_length, attn_sink=attn_sink,
                                     return_lse=True)


def test_export_runs_in_a_fresh_process(tmp_path):
    q, kv, idx = inputs(3)
    packed = jax_mla.pack_fp8_kv(kv.astype(jnp.float32))
    args = [np.asarray(x) for x in (q, packed, idx, np.array([8, 3], np.int32),
                                    np.linspace(-2, 2, 16).astype(np.float32))]
    fn = jax.jit(sparse_step)
    want = [np.asarray(x) for x in fn(*args)]
    with open(tmp_path / "inputs.pkl", "wb") as f:
        pickle.dump(args, f)
    exp = jax.export.export(fn, disabled_checks=jax_mla.export_disabled_checks())(*args)
    assert "jax_mla_decode_sparse" in exp.mlir_module()
    with open(tmp_path / "sparse_cpu.bin", "wb") as f:
        f.write(exp.serialize())
    with open(tmp_path / "sparse_cpu.pkl", "wb") as f:
        pickle.dump(want, f)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-P", os.path.join(TESTS, "export_worker.py"), str(tmp_path)],
                          cwd=str(tmp_path), capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "sparse_cpu: ok" in proc.stdout, proc.stdout
