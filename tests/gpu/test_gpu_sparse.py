"""mla_decode_sparse on a GPU: the kernel auto picks (for an FP8 cache SM90 on an H100 / H200, whose
producer warp gathers the one-token pages; portable for a 16-bit cache and elsewhere; both:
test_gpu_dispatch.py test_sparse_decode_on_each_kernel) over the cache seen as one-token pages,
one request per query token (cuda/runtime/sparse_launch.h), against float64 on the gathered rows
(cases.make_sparse / cases.sparse_brute_force, shared with the CPU tests in tests/cpu/test_sparse.py).

Every test here is marked `gpu` (skipped without a GPU, a failure with JAX_MLA_REQUIRE_GPU=1):

    JAX_MLA_REQUIRE_GPU=1 python3 -P -m pytest -q -m gpu tests/gpu/test_gpu_sparse.py

Tolerance: the 16-bit kernels' (relative L2 1e-2 for out, 1e-3 for lse: P is rounded to 16 bits
for P V). Pages no index selects hold NaN (poisoned FP8 rows), so reading one fails the structure
check (no NaN, out 0 and lse -inf exactly on tokens with no counted index). What is checked:
  - random index lists (duplicates, -1) over bf16 / fp16 q, 16-bit and FP8 caches, page sizes 16,
    64 and 3 (any page size works: the GPU sees pages of one token), s_q 1..4, h_q 1..128 (odd ones
    too), topk up to 2048, with and without jit;
  - topk_length (0, partial, full, and traced values outside [0, topk], clamped) with anything past
    it (out-of-range indices, poisoned slots), tokens with no counted index, 64 copies of one slot;
  - an out-of-range index (>= num_pages * page_size, or negative other than -1) makes out and lse of
    that query token NaN for all heads and nothing else, also when its request is split over parts
    (the combine's few- and many-split merges); past topk_length it is ignored;
  - the attention sink (lse unchanged bit for bit, -inf sink = none, large sinks = 0, empty tokens
    stay 0 / -inf), per instance under vmap;
  - bits: jax.jit and eager agree, repeated calls agree, an FP8 cache gives exactly the 16-bit
    path's bits on unpack_fp8_kv(cache, q's dtype), jax.export for CUDA runs; with
    batch_invariant=True a request's bits alone and anywhere in batches of 1 .. 200 others are the
    same (and without it they move);
  - agreement with the CPU kernel.
"""

from __future__ import annotations

import zlib

import jax
import numpy as np
import pytest

import cases
import jax_mla
from jax_mla import _api, _ext

pytestmark = pytest.mark.gpu
needs_reader = pytest.mark.skipif("portable" not in jax_mla._validate.FP8_KERNELS, reason=cases.NO_GPU_FP8_READER)
CACHES = ["bf16cache", pytest.param("fp8cache", marks=needs_reader)]
INT32_MAX = 2**31 - 1


def gpu():
    return jax.devices("gpu")[0]


def cpu():
    return jax.devices("cpu")[0]


def make(seed, **kw):
    """cases.make_sparse, built on the CPU (pack_fp8_kv's bytes do not depend on the device)."""
    with jax.default_device(cpu()):
        return cases.make_sparse(seed, **kw)


def run_gpu(q, kv, idx, *, jit=False, topk_length=None, attn_sink=None, softmax_scale=None):
    """(out, lse) as NumPy arrays of mla_decode_sparse on the GPU; with jit the indices (and
    topk_length) are traced, so only the device sees their values."""
    kw = dict(softmax_scale=softmax_scale, return_lse=True)
    put = lambda x: None if x is None else jax.device_put(np.asarray(x), gpu())  # noqa: E731
    args = [put(x) for x in (q, kv, idx, topk_length, attn_sink)]
    fn = lambda q, kv, idx, tl, sink: jax_mla.mla_decode_sparse(  # noqa: E731
        q, kv, idx, topk_length=tl, attn_sink=sink, **kw)
    with jax.default_device(gpu()):
        out, lse = (jax.jit(fn) if jit else fn)(*args)
    assert out.devices() == {gpu()}
    return np.asarray(out), np.asarray(lse)


def check(q, out, lse, ref):
    assert out.shape == q.shape[:3] + (512,) and out.dtype == q.dtype
    assert lse.shape == q.shape[:3] and lse.dtype == np.float32
    cases.assert_close_rel_l2(out, lse, *ref, out_tol=1e-2, lse_tol=1e-3)


def num_parts_of(h_q):
    """The parts the CUDA lowering plans with (jax_mla/_lowering.py)."""
    return _api.default_num_parts(1, h_q)


def splits_of(idx, h_q, topk_length=None):
    """Splits per query token of the plan the GPU makes for these indices (the host planner on the
    compacted lengths; the device scheduler builds the same array, tests/gpu/test_gpu.py)."""
    b, s_q, topk = idx.shape
    n = np.full(b, topk) if topk_length is None else np.clip(topk_length, 0, topk)
    lens = np.array([(idx[r, t, :n[r]] != -1).sum() for r in range(b) for t in range(s_q)], np.int32)
    parts = num_parts_of(h_q)
    sched = np.asarray(_ext.testing.plan_schedule(lens, parts))
    return np.diff(sched[parts * 8:parts * 8 + len(lens) + 1])


SHAPES = [  # (b, s_q, h_q, topk)
    (2, 1, 16, 7),
    (2, 2, 64, 64),
    (1, 4, 128, 1),
    (2, 3, 16, 2048),
    (1, 1, 128, 2048),  # one token: split over many parts
    (3, 2, 33, 100),    # odd h_q: a partial row block
    (2, 1, 1, 40),
]


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("page_size", [16, 64, 3])
def test_matches_float64(dtype, cache, page_size):
    for i, (b, s_q, h_q, topk) in enumerate(SHAPES):
        seed = zlib.crc32(repr(("gpu", dtype, cache, page_size, i)).encode())
        num_pages = max(4, -(-2 * topk // page_size) + 2)
        q, kv, idx, rows64 = make(seed, b=b, s_q=s_q, h_q=h_q, topk=topk, page_size=page_size,
                                  num_pages=num_pages, dtype=dtype, fp8=cache == "fp8cache")
        ref = cases.sparse_brute_force(q, rows64, idx)
        check(q, *run_gpu(q, kv, idx, jit=i % 2 == 1), ref)


def test_splits_are_exercised():
    """The split cases above reach the combine's classes: one token of 2048 indices over 66+ parts is
    cut into many pieces (> MANY_SPLITS), 300 indices into 2..8."""
    _, _, idx, _ = make(1, b=1, s_q=1, h_q=128, topk=2048, num_pages=260, p_invalid=0.0)
    assert splits_of(idx, 128).max() > _ext.limits()["MANY_SPLITS"]
    _, _, idx, _ = make(1, b=1, s_q=1, h_q=16, topk=300, p_invalid=0.0)
    assert 2 <= splits_of(idx, 16).max() <= _ext.limits()["MANY_SPLITS"]


def test_softmax_scale_and_peaky_scores():
    q, kv, idx, rows64 = make(6, s_q=2, h_q=64, topk=64, dtype="float16")
    for scale in (0.01, 0.3):
        check(q, *run_gpu(q, kv, idx, softmax_scale=scale), cases.sparse_brute_force(q, rows64, idx, scale=scale))
    q, kv, idx, rows64 = make(16, b=1, s_q=1, h_q=128, topk=1024, num_pages=140, scale_q=3.0)
    check(q, *run_gpu(q, kv, idx), cases.sparse_brute_force(q, rows64, idx))


@pytest.mark.parametrize("cache", CACHES)
def test_adversarial_indices(cache):
    q, kv, idx, rows64 = make(1, b=3, s_q=2, topk=64, fp8=cache == "fp8cache")
    idx[0] = -1                         # request 0: no valid index at all -> out 0, lse -inf
    idx[1, 0, :] = 5                    # every index the same slot (64 duplicates)
    idx[1, 1, ::2] = -1                 # half skipped
    out, lse = run_gpu(q, kv, idx, jit=True)
    check(q, out, lse, cases.sparse_brute_force(q, rows64, idx))
    assert (out[0].astype(np.float32) == 0).all() and np.isneginf(lse[0]).all()
    # 64 copies of one slot: softmax weight 1 on it, lse = score + log 64.
    s = np.asarray(q[1, 0], np.float64) @ rows64[5] * 576 ** -0.5
    np.testing.assert_allclose(lse[1, 0].astype(np.float64), s + np.log(64), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(out[1, 0].astype(np.float64), np.broadcast_to(rows64[5, :512], (16, 512)),
                               rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("topk", [64, 2048])
def test_topk_length(cache, topk):
    b = 4
    q, kv, idx, rows64 = make(2, b=b, s_q=3, topk=topk, num_pages=max(12, topk // 8), fp8=cache == "fp8cache",
                              p_invalid=0.1)
    slots = kv.shape[0] * kv.shape[1]
    poisoned = slots - 1  # the last page is never selected: NaN
    # Past topk_length the indices may be anything: out of range, negative, poisoned.
    tl = np.array([0, 17, topk, 1], np.int32)
    counted = idx.copy()  # every index valid or -1, for the clamped lengths below
    for r, n in enumerate(tl):
        idx[r, :, n:] = np.array([10**6, poisoned, -5, INT32_MAX])[np.arange(topk - n) % 4]
    ref = cases.sparse_brute_force(q, rows64, idx, tl)
    eager = run_gpu(q, kv, idx, topk_length=tl)
    check(q, *eager, ref)
    assert np.isneginf(eager[1][0]).all()
    jitted = run_gpu(q, kv, idx, topk_length=tl, jit=True)
    for x, y in zip(eager, jitted):
        np.testing.assert_array_equal(x.view(np.uint8), y.view(np.uint8))
    # Traced values outside [0, topk] are clamped (over indices that are all valid or -1: a clamp
    # to topk counts every index of its token).
    wild = np.array([-5, 17, topk + 99, INT32_MAX], np.int32)
    check(q, *run_gpu(q, kv, counted, topk_length=wild, jit=True),
          cases.sparse_brute_force(q, rows64, counted, np.clip(wild, 0, topk)))


# Out-of-range indices besides num_pages * page_size (+ 5): negative ones other than -1, and huge.
BAD_INDICES = [-2, -7, INT32_MAX, -(2**31)]


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("split", ["whole", "few", "many"])
@pytest.mark.parametrize("where", ["first", "last"])
def test_out_of_range_index_gives_nan_for_that_token_only(cache, split, where):
    """Under jit only the device sees the indices: an index outside the cache (other than -1) makes
    out and lse of its query token NaN, for every head, through the split merge; it is never read.
    Other tokens (of the same request too) are unaffected, and a bad index past topk_length counts
    for nothing."""
    b, s_q, h_q, topk = {"whole": (3, 2, 16, 7), "few": (1, 2, 16, 300), "many": (1, 2, 128, 2048)}[split]
    num_pages = 12 if topk <= 64 else topk // 8
    q, kv, idx, rows64 = make(7, b=b, s_q=s_q, h_q=h_q, topk=topk, num_pages=num_pages, p_invalid=0.05,
                              fp8=cache == "fp8cache")
    slots = kv.shape[0] * kv.shape[1]
    splits = splits_of(idx, h_q).max()
    assert {"whole": splits == 1, "few": 2 <= splits <= 8, "many": splits > 8}[split], splits
    r, t = b - 1, 1
    k = 3 if where == "first" else topk - 2
    ref_out, ref_lse = cases.sparse_brute_force(q, rows64, idx)
    for bad in [slots, slots + 5] + BAD_INDICES:
        bad_idx = idx.copy()
        bad_idx[r, t, k] = bad
        out, lse = run_gpu(q, kv, bad_idx, jit=True)
        assert np.isnan(out[r, t].astype(np.float32)).all() and np.isnan(lse[r, t]).all(), bad
        keep = np.ones((b, s_q), bool)
        keep[r, t] = False
        cases.assert_close_rel_l2(out[keep], lse[keep], ref_out[keep], ref_lse[keep], out_tol=1e-2, lse_tol=1e-3)
    # Past topk_length: not counted, not NaN.
    bad_idx = idx.copy()
    bad_idx[r, t, k] = slots
    tl = np.full(b, k, np.int32)
    check(q, *run_gpu(q, kv, bad_idx, topk_length=tl, jit=True), cases.sparse_brute_force(q, rows64, bad_idx, tl))


def test_concrete_out_of_range_index_is_a_value_error():
    q, kv, idx, _ = make(7, b=2, s_q=2, topk=7)
    idx[1, 1, 3] = 12 * 16
    with pytest.raises(ValueError, match=r"indices\[1, 1, 3\] = 192 \(request 1, query token 1\)"):
        run_gpu(q, kv, idx)


@pytest.mark.parametrize("cache", CACHES)
def test_sinks(cache):
    q, kv, idx, rows64 = make(4, b=2, s_q=2, h_q=16, topk=512, num_pages=64, fp8=cache == "fp8cache")
    idx[1, 1] = -1  # an empty token stays 0 / -inf with a sink
    rng = np.random.default_rng(5)
    sink = rng.standard_normal(16).astype(np.float32) * 3
    sink[0], sink[1], sink[2] = -np.inf, 1e4, 1e30
    out, lse = run_gpu(q, kv, idx, attn_sink=sink, jit=True)
    check(q, out, lse, cases.sparse_brute_force(q, rows64, idx, sink=sink))
    out0, lse0 = run_gpu(q, kv, idx, jit=True)
    np.testing.assert_array_equal(lse, lse0)  # lse unchanged
    np.testing.assert_array_equal(out[:, :, 0].view(np.uint16), out0[:, :, 0].view(np.uint16))  # -inf: none
    assert (out[:, :, 1:3].astype(np.float32) == 0).all()  # large sinks take all the mass
    assert (out[1, 1].astype(np.float32) == 0).all() and np.isneginf(lse[1, 1]).all()


def test_vmap_per_instance_caches_and_sinks():
    V = 3
    datas = [make(20 + v, b=2, s_q=2, topk=300, num_pages=40, fp8=False) for v in range(V)]
    qs, kvs, idxs = (np.stack([d[i] for d in datas]) for i in range(3))
    tls = np.array([[300, 5], [0, 300], [90, 90]], np.int32)
    sinks = np.random.default_rng(9).standard_normal((V, 16)).astype(np.float32)
    f = jax.jit(jax.vmap(lambda q, kv, i, tl, s: jax_mla.mla_decode_sparse(q, kv, i, topk_length=tl, attn_sink=s,
                                                                           return_lse=True)))
    out, lse = (np.asarray(x) for x in f(*[jax.device_put(x, gpu()) for x in (qs, kvs, idxs, tls, sinks)]))
    for v in range(V):
        check(qs[v], out[v], lse[v], cases.sparse_brute_force(qs[v], datas[v][3], idxs[v], tls[v], sink=sinks[v]))
    # An out-of-range index of one instance: NaN for that token only (never another instance's rows).
    bad = idxs.copy()
    bad[1, 1, 1, 0] = 40 * 16  # instance 1, request 1 (all 300 indices count), token 1
    out, lse = (np.asarray(x) for x in f(*[jax.device_put(x, gpu()) for x in (qs, kvs, bad, tls, sinks)]))
    assert np.isnan(lse[1, 1, 1]).all() and np.isnan(out[1, 1, 1].astype(np.float32)).all()
    finite = np.ones(out.shape[:3], bool)
    finite[1, 1, 1] = False
    assert np.isfinite(out[finite].astype(np.float32)).all() and not np.isnan(lse[finite]).any()


@pytest.mark.parametrize("cache", CACHES)
def test_jit_and_eager_agree_bit_for_bit(cache):
    for i, (b, s_q, h_q, topk) in enumerate([(3, 2, 16, 100), (1, 1, 128, 2048), (2, 4, 64, 700)]):
        q, kv, idx, _ = make(30 + i, b=b, s_q=s_q, h_q=h_q, topk=topk, num_pages=max(12, topk // 4),
                             fp8=cache == "fp8cache")
        tl = np.array([topk, topk // 2, 3][:b], np.int32)
        sink = np.linspace(-3, 3, h_q).astype(np.float32)
        eager = run_gpu(q, kv, idx, topk_length=tl, attn_sink=sink)
        for _ in range(2):  # and again: identical calls give identical bits
            jitted = run_gpu(q, kv, idx, topk_length=tl, attn_sink=sink, jit=True)
            for x, y in zip(eager, jitted):
                np.testing.assert_array_equal(x.view(np.uint8), y.view(np.uint8))


@needs_reader
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_fp8_cache_gives_the_16bit_paths_bits_on_the_dequantized_cache(dtype):
    """The kernel dequantizes an FP8 row exactly as unpack_fp8_kv(row, q's dtype), then runs the
    16-bit path unchanged: the same bits as the sparse call over the unpacked cache, where both
    run on the same kernel. On an SM90 device auto runs an FP8 cache on the SM90 kernel and a 16-bit
    one on the portable kernel: test_gpu_dispatch.py test_sparse_decode_kernel_choice_per_cache_format
    checks the rule there, per kernel."""
    info = jax_mla.kernel_info(jax.devices("gpu")[0])
    if info["kernel"] == "sm90":
        pytest.skip("the FP8 and the 16-bit cache run on different kernels here (SM90, portable)")
    q, kv, idx, _ = make(40, b=2, s_q=2, h_q=64, topk=1500, num_pages=200, dtype=dtype, fp8=True)
    with jax.default_device(cpu()):
        unpacked = np.asarray(jax_mla.unpack_fp8_kv(kv, cases.DTYPES[dtype]))
    for x, y in zip(run_gpu(q, kv, idx), run_gpu(q, unpacked, idx)):
        np.testing.assert_array_equal(x.view(np.uint8), y.view(np.uint8))


def test_agrees_with_the_cpu_kernel():
    q, kv, idx, _ = make(50, b=3, s_q=2, h_q=64, topk=400, num_pages=60, page_size=7)
    tl = np.array([400, 123, 0], np.int32)
    sink = np.linspace(-2, 2, 64).astype(np.float32)
    with jax.default_device(cpu()):
        want = jax_mla.mla_decode_sparse(q, kv, idx, topk_length=tl, attn_sink=sink, return_lse=True)
    out, lse = run_gpu(q, kv, idx, topk_length=tl, attn_sink=sink)
    cases.assert_close_rel_l2(out, lse, np.asarray(want[0], np.float64), np.asarray(want[1], np.float64),
                              out_tol=1e-2, lse_tol=1e-3)


def test_export_for_cuda_runs():
    q, kv, idx, rows64 = make(60, b=2, s_q=2, h_q=16, topk=128, num_pages=40)
    tl = np.array([128, 77], np.int32)
    sink = np.linspace(-1, 1, 16).astype(np.float32)

    def step(q, kv, idx, tl, sink):
        return jax_mla.mla_decode_sparse(q, kv, idx, topk_length=tl, attn_sink=sink, return_lse=True)

    args = [jax.device_put(x, gpu()) for x in (q, kv, idx, tl, sink)]
    exp = jax.export.export(jax.jit(step), platforms=("cuda",),
                            disabled_checks=jax_mla.export_disabled_checks())(*args)
    exp = jax.export.deserialize(exp.serialize())
    with jax.default_device(gpu()):
        got = [np.asarray(x) for x in exp.call(*args)]
        want = [np.asarray(x) for x in jax.jit(step)(*args)]
    for x, y in zip(got, want):
        np.testing.assert_array_equal(x.view(np.uint8), y.view(np.uint8))
    check(q, *got, cases.sparse_brute_force(q, rows64, idx, tl, sink=sink))


def _invariance_batch(rng, target, others, pos, kv_slots, topk):
    """q and indices of a batch of `others` random query rows with the target's at position pos."""
    q_t, idx_t = target
    b = others + 1
    q = rng.standard_normal((b,) + q_t.shape[1:]).astype(q_t.dtype)
    idx = rng.integers(0, kv_slots, size=(b,) + idx_t.shape[1:]).astype(np.int32)
    # Other rows select between none and all of topk slots: the default plan's splits move.
    keep = rng.integers(0, topk + 1, size=b)
    idx[np.broadcast_to(np.arange(topk)[None, None, :] >= keep[:, None, None], idx.shape)] = -1
    q[pos], idx[pos] = q_t[0], idx_t[0]
    return q, idx


@pytest.mark.parametrize("cache", CACHES)
@pytest.mark.parametrize("h_q,topk", [(64, 2048), (128, 700), (16, 129)])
def test_batch_invariant_bits_do_not_depend_on_the_batch(cache, h_q, topk):
    """batch_invariant=True: a request's out and lse alone and at the first, a middle and the last
    position of batches of 1 .. 200 random others are the same bits (every query token is one
    request of the chunked plan; chunks of 1024 and of 128 slots)."""
    fp8 = cache == "fp8cache"
    q, kv, idx, rows64 = make(41 + h_q, b=1, s_q=2, h_q=h_q, topk=topk, num_pages=40, page_size=64, fp8=fp8,
                              p_invalid=0.1)
    live = 20 * 64  # make_sparse selects from the first half of the pages
    for chunk in (None, 128):
        kw = dict(batch_invariant=True, invariant_chunk=chunk)
        alone = run_gpu_kw(q, kv, idx, **kw)
        check(q, *alone, cases.sparse_brute_force(q, rows64, idx))
        rng = np.random.default_rng(7)
        for others in (1, 5, 60, 200):
            for pos in sorted({0, others // 2, others}):
                qb, ib = _invariance_batch(rng, (q, idx), others, pos, live, topk)
                out, lse = run_gpu_kw(qb, kv, ib, **kw)
                np.testing.assert_array_equal(out[pos], alone[0][0], err_msg=f"{others} others, at {pos}")
                np.testing.assert_array_equal(lse[pos], alone[1][0], err_msg=f"{others} others, at {pos}")


def test_without_batch_invariant_the_bits_do_change():
    """The comparison above can fail: with the default plans a request alone (split over many parts)
    and in a large batch (not split) gets different bits."""
    q, kv, idx, _ = make(43, b=1, s_q=1, h_q=64, topk=2048, num_pages=40, page_size=64, p_invalid=0.0)
    alone = run_gpu_kw(q, kv, idx)
    qb, ib = _invariance_batch(np.random.default_rng(8), (q, idx), 255, 0, 20 * 64, 2048)
    out, lse = run_gpu_kw(qb, kv, ib)
    assert not (np.array_equal(out[0], alone[0][0]) and np.array_equal(lse[0], alone[1][0]))


def run_gpu_kw(q, kv, idx, **kw):
    """(out, lse) of mla_decode_sparse on the GPU under jit, with static keyword arguments."""
    args = [jax.device_put(np.asarray(x), gpu()) for x in (q, kv, idx)]
    fn = jax.jit(lambda q, kv, idx: jax_mla.mla_decode_sparse(q, kv, idx, return_lse=True, **kw))
    with jax.default_device(gpu()):
        out, lse = fn(*args)
    return np.asarray(out), np.asarray(lse)
