"""mla_decode(..., batch_invariant=True) on the CPU kernel: a request's out and lse are bitwise the
same alone and anywhere in batches of 1 .. 256 random others; the plan behind it; the arguments'
validation. The GPU twin is tests/gpu/test_gpu_batch_invariant.py."""

from __future__ import annotations


import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cases
import invariance
import jax_mla
from jax_mla import _ext, _validate

pytestmark = pytest.mark.usefixtures("on_cpu")

BLOCK_N = _validate.BLOCK_N
DEFAULT_CHUNK = _validate.DEFAULT_INVARIANT_CHUNK

# (config, mla_decode keyword arguments, batch sizes (others); None: invariance.batch_sizes())
CONFIGS = [
    # Default chunk (1024 tokens): targets of 0 .. 9 chunks, at and around page / block / chunk edges.
    (invariance.Config(target_lens=(0, 1, 63, 64, 65, 1023, 1024, 1025, 3001, 5000, 9000), seed=1),
     {}, None),
    # Small chunk and few parts: long targets hit the cap of num_parts chunks (longer chunks);
    # s_q = 2 causal, fp16, pages of 16 tokens.
    (invariance.Config(target_lens=(0, 1, 2, 129, 500, 2000, 4001), s_q=2, h_q=3, page_size=16,
                       dtype="float16", causal=True, other_long=3000, seed=2),
     dict(invariant_chunk=128, schedule_num_parts=5), (0, 1, 3, 40, 256)),
    # Two row blocks (h_q = 128), pages of 128 tokens; smaller batches (the CPU's cost is rows * keys).
    (invariance.Config(target_lens=(5, 1024, 2049, 4500), h_q=128, page_size=128, other_long=2500, seed=3),
     {}, (0, 1, 4, 31)),
]


def runner(cfg: invariance.Config, batch_invariant=True, invariant_chunk=None, schedule_num_parts=None,
           pass_schedule=False, fp8=False):
    def run(q, kv, bt, sl):
        if fp8:
            # The batch's cache as FP8 rows: quantized per token, so a target's rows are the same
            # bytes in every batch (the unused NaN rows become other bytes nobody reads).
            kv = jax_mla.pack_fp8_kv(kv)
        kw = dict(causal=cfg.causal, return_lse=True, batch_invariant=batch_invariant)
        if invariant_chunk is not None:
            kw["invariant_chunk"] = invariant_chunk
        if schedule_num_parts is not None or pass_schedule:
            kw["schedule"] = jax_mla.decode_schedule(sl, num_heads=cfg.h_q, seq_q=cfg.s_q,
                                                     num_parts=schedule_num_parts,
                                                     batch_invariant=batch_invariant,
                                                     invariant_chunk=invariant_chunk)
        return jax_mla.mla_decode(q, kv, bt, sl, **kw)
    return run


@pytest.mark.parametrize("cfg,kw,sizes", CONFIGS, ids=["chunk1024", "chunk128-parts5-causal", "h128"])
def test_request_bits_do_not_depend_on_the_batch(cfg, kw, sizes):
    """Batches alternate between the op's own schedule and decode_schedule's (the same bits)."""
    run = runner(cfg, **kw)
    runs = [run] if "schedule_num_parts" in kw else [run, runner(cfg, pass_schedule=True, **kw)]
    # Alone, each target is within the rounding of the output dtype of the float64 truth.
    for t in invariance.targets(cfg):
        out, lse = run(*t.data.args)
        ref_out, ref_lse = cases.reference(t.data)
        cases.assert_close_rounding_only(out, lse, ref_out, ref_lse, cfg.dtype, cases.max_abs_score(t.data))
    compared = invariance.check_invariant(runs, cfg, sizes=sizes, seed=cfg.seed)
    assert compared == len(cfg.target_lens) * 3 * len(sizes or invariance.batch_sizes())


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_fp8_cache_bits_do_not_depend_on_the_batch(dtype):
    """The same contract over an FP8 cache (uint8 rows of 656 bytes): only the rows' loading
    differs, not the plan or the merge. Batches alternate the op's and decode_schedule's plans."""
    cfg = invariance.Config(target_lens=(0, 1, 65, 1025, 3001), h_q=8, dtype=dtype, other_long=3000,
                            seed=8)
    runs = [runner(cfg, fp8=True), runner(cfg, fp8=True, pass_schedule=True)]
    sizes = (0, 1, 5, 40)
    compared = invariance.check_invariant(runs, cfg, sizes=sizes, seed=cfg.seed, pool=True)
    assert compared == len(cfg.target_lens) * 3 * len(sizes)


def test_in_op_and_passed_schedules_give_the_same_bits():
    cfg = invariance.Config(target_lens=(70, 3000), seed=4)
    (t0, t1) = invariance.targets(cfg)
    rng = np.random.default_rng(0)
    bt = invariance.batch(rng, cfg, [t0, t1], 20, 0, "middle")
    a = runner(cfg)(*bt.args)
    b = runner(cfg, pass_schedule=True)(*bt.args)
    c = runner(cfg, schedule_num_parts=7)(*bt.args)  # 7 chunks of 1024 tokens hold every request
    for x in (b, c):
        np.testing.assert_array_equal(np.asarray(x[0]), np.asarray(a[0]))
        np.testing.assert_array_equal(np.asarray(x[1]), np.asarray(a[1]))


def test_vmap_keeps_the_bits():
    """Under vmap the instances become one batch; each keeps its bits."""
    cfg = invariance.Config(target_lens=(1500, 64), seed=5)
    tgts = invariance.targets(cfg)
    rng = np.random.default_rng(1)
    b1 = invariance.batch(rng, cfg, tgts, 3, 0, "first")
    b2 = invariance.batch(rng, cfg, tgts, 3, 1, "last")
    # Same shapes for stacking: pad the smaller cache / table.
    args = []
    for x1, x2 in zip(b1.args, b2.args):
        if x1.ndim >= 2 and x1.shape != x2.shape:
            shape = tuple(max(a, b) for a, b in zip(x1.shape, x2.shape))
            fill = -1 if x1.dtype == np.int32 else np.nan
            p1, p2 = np.full(shape, fill, x1.dtype), np.full(shape, fill, x2.dtype)
            p1[tuple(slice(0, n) for n in x1.shape)] = x1
            p2[tuple(slice(0, n) for n in x2.shape)] = x2
            x1, x2 = p1, p2
        args.append(np.stack([x1, x2]))
    run = runner(cfg)
    out, lse = jax.vmap(lambda *a: run(*a))(*args)
    for i, bt in enumerate((b1, b2)):
        want = run(*(a[i] for a in args))
        np.testing.assert_array_equal(np.asarray(out[i]), np.asarray(want[0]))
        np.testing.assert_array_equal(np.asarray(lse[i]), np.asarray(want[1]))


def test_bits_do_not_depend_on_num_parts_below_the_cap():
    """num_parts only decides where a chunk runs, for requests of at most num_parts chunks."""
    cfg = invariance.Config(target_lens=(4000, 100), other_long=4096, seed=6)
    tgts = invariance.targets(cfg)
    bt = invariance.batch(np.random.default_rng(2), cfg, tgts, 10, 0, "first")
    # Every request has at most 4 chunks of 1024 tokens: the same chunks for every num_parts >= 4.
    results = [runner(cfg, schedule_num_parts=n)(*bt.args) for n in (4, 9, 132)]
    for out, lse in results[1:]:
        np.testing.assert_array_equal(np.asarray(out), np.asarray(results[0][0]))
        np.testing.assert_array_equal(np.asarray(lse), np.asarray(results[0][1]))


def test_without_the_flag_the_bits_do_change():
    """The comparison of test_request_bits_do_not_depend_on_the_batch can fail: the default plans
    cut a request where the batch puts the part boundaries, so the same request's bits differ
    between batches (here found within the first configuration's batches)."""
    cfg, _, _ = CONFIGS[0]
    found = invariance.find_difference(runner(cfg, batch_invariant=False), cfg, seed=cfg.seed)
    assert found is not None
    print("default plans:", found)


# ----------------------------------------------------------------------------------------------
# The plan
# ----------------------------------------------------------------------------------------------


def nb_of(n):
    return -(-max(int(n), 0) // BLOCK_N)


def walk(schedule, seq_lens, num_parts):
    """The pieces every kernel runs (cuda/common/work_iterator.h for_each_piece), per part:
    (part, request, begin_block, end_block, slot, num_splits)."""
    b = len(seq_lens)
    info = schedule[:num_parts * 8].reshape(num_parts, 8)
    offsets = schedule[num_parts * 8:num_parts * 8 + b + 1]
    pieces = []
    for p in range(num_parts):
        first, last = int(info[p, 0]), int(info[p, 2])
        for r in range(first, last + 1):
            nb = nb_of(seq_lens[r])
            begin = int(info[p, 1]) if r == first else 0
            end = int(info[p, 3]) if r == last else nb
            slot = int(info[p, 4]) if r == first else int(offsets[r])
            if begin >= end:
                continue
            chunk, cap = int(info[p, 5]), int(info[p, 6])
            step = max(chunk, -(-nb // cap)) if chunk else end - begin
            while begin < end:
                stop = min(begin + step, end)
                pieces.append((p, r, begin, stop, slot, int(offsets[r + 1] - offsets[r])))
                begin, slot = stop, slot + 1
    return pieces


@pytest.mark.parametrize("seed", range(6))
def test_invariant_plan_runs_each_chunk_once(seed):
    rng = np.random.default_rng(seed)
    for _ in range(20):
        b = int(rng.integers(1, 60))
        lens = np.array(invariance.other_lengths(rng, b, invariance.Config(target_lens=(1,))), np.int32)
        if rng.random() < 0.3:
            lens[int(rng.integers(0, b))] = int(rng.integers(20000, 200000))
        num_parts = int(rng.choice([1, 2, 7, 33, 66, 132]))
        chunk = int(rng.choice([1, 2, 5, 16, 64]))
        sched = np.asarray(_ext.testing.plan_schedule(lens, num_parts, chunk))
        assert sched.shape == (_validate.schedule_size(b, num_parts, True),)
        # The op's own plan and decode_schedule's are this array.
        op = jax_mla.decode_schedule(lens, num_heads=16, num_parts=num_parts, batch_invariant=True,
                                     invariant_chunk=chunk * BLOCK_N)
        np.testing.assert_array_equal(np.asarray(op), sched)
        offsets = sched[num_parts * 8:num_parts * 8 + b + 1]
        pieces = walk(sched, lens, num_parts)
        # Every request's pieces are its own fixed chunks, each run once at its own slot.
        got = sorted((r, lo, hi, slot, n) for _, r, lo, hi, slot, n in pieces)
        want = []
        for r, n in enumerate(lens):
            nb = nb_of(n)
            if nb == 0:
                assert offsets[r + 1] == offsets[r]
                continue
            cr = max(chunk, -(-nb // num_parts))
            k = -(-nb // cr)
            assert offsets[r + 1] - offsets[r] == k
            want += [(r, j * cr, min((j + 1) * cr, nb), int(offsets[r]) + j, k) for j in range(k)]
        assert got == want
        assert offsets[b] <= b * num_parts  # the workspace bound (max_splits)
        # Parts are contiguous and in order.
        assert [(r, lo) for _, r, lo, *_ in pieces] == sorted((r, lo) for _, r, lo, *_ in pieces)
        # Combine list: every request with a number of chunks other than one, all in the few-split class.
        head = num_parts * 8 + b + 1
        count, many = sched[head], sched[head + 1]
        listed = sched[head + 2:head + 2 + b]
        split = [r for r in range(b) if offsets[r + 1] - offsets[r] != 1]
        assert many == 0 and count == len(split)
        np.testing.assert_array_equal(listed[:count], split)
        assert (listed[count:] == -1).all()
        np.testing.assert_array_equal(sched[-4:], [chunk, num_parts, 0, 0])


def test_a_request_alone_and_in_a_batch_gets_the_same_chunks():
    lens = np.array([5000, 0, 1, 70000, 64], np.int32)
    big = np.asarray(_ext.testing.plan_schedule(lens, 132, 16))
    for r, n in enumerate(lens):
        alone = np.asarray(_ext.testing.plan_schedule(np.array([n], np.int32), 132, 16))
        a = [(lo, hi) for _, _, lo, hi, _, _ in walk(alone, [n], 132)]
        b = sorted((lo, hi) for _, rr, lo, hi, _, _ in walk(big, lens, 132) if rr == r)
        assert a == b


def test_max_chunks_bounds_long_requests():
    """S = invariant_max_chunks: num_parts, or what the block table's capacity needs."""
    assert _ext.invariant_max_chunks(66, 16, -1) == 66
    assert _ext.invariant_max_chunks(66, 16, 4096) == 4        # 64 blocks / 16
    assert _ext.invariant_max_chunks(66, 16, 4097) == 5
    assert _ext.invariant_max_chunks(66, 16, 10**7) == 66
    assert _ext.invariant_max_chunks(66, 16, 0) == 1
    # A valid request (<= capacity) is cut the same with either bound.
    for n in (1, 1023, 1024, 1025, 4096, 65 * 1024, 70000):
        lens = np.array([n], np.int32)
        cap = _ext.invariant_max_chunks(66, 16, n)
        a = np.asarray(_ext.testing.plan_schedule(lens, 66, 16, cap))
        b = np.asarray(_ext.testing.plan_schedule(lens, 66, 16))
        assert [p[2:4] for p in walk(a, lens, 66)] == [p[2:4] for p in walk(b, lens, 66)]


def test_workspace_grows_only_in_invariant_mode():
    assert _ext.workspace_bytes(8, 16, 66) == _ext.workspace_bytes(8, 16, 66, 0)
    assert _ext.workspace_bytes(8, 16, 66, 66) > _ext.workspace_bytes(8, 16, 66)


# ----------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------


def small_args():
    data = cases.make(cases.Case(lens=(70, 3), seed=9))
    return data.args


@pytest.mark.parametrize("kw,exc,words", [
    (dict(batch_invariant=1), TypeError, ["batch_invariant", "bool", "int"]),
    (dict(batch_invariant="yes"), TypeError, ["batch_invariant", "str"]),
    (dict(batch_invariant=None), TypeError, ["batch_invariant"]),
    (dict(invariant_chunk=1024), ValueError, ["invariant_chunk", "batch_invariant=True"]),
    (dict(batch_invariant=True, invariant_chunk=1000), ValueError, ["invariant_chunk", "multiple of 64"]),
    (dict(batch_invariant=True, invariant_chunk=0), ValueError, ["invariant_chunk"]),
    (dict(batch_invariant=True, invariant_chunk=-64), ValueError, ["invariant_chunk"]),
    (dict(batch_invariant=True, invariant_chunk=2**31), ValueError, ["invariant_chunk"]),
    (dict(batch_invariant=True, invariant_chunk=1024.0), TypeError, ["invariant_chunk", "float"]),
    (dict(batch_invariant=True, invariant_chunk=True), TypeError, ["invariant_chunk", "bool"]),
])
def test_flag_validation(kw, exc, words):
    for fn in (lambda: jax_mla.mla_decode(*small_args(), **kw),
               lambda: jax_mla.decode_schedule(np.array([70, 3], np.int32), num_heads=16, **kw)):
        with pytest.raises(exc) as e:
            fn()
        for w in words:
            assert w in str(e.value), (w, str(e.value))


def test_flag_validation_at_trace_time():
    """Under jit the static flag is checked while tracing, before anything runs."""
    args = small_args()
    with pytest.raises(TypeError, match="batch_invariant"):
        jax.jit(lambda *a: jax_mla.mla_decode(*a, batch_invariant=np.array([True, False]))).lower(*args)
    with pytest.raises(ValueError, match="invariant_chunk"):
        jax.jit(lambda *a: jax_mla.mla_decode(*a, batch_invariant=True, invariant_chunk=65)).lower(*args)


def test_a_schedule_of_the_other_mode_is_refused():
    args = small_args()
    sl = args[3]
    inv = jax_mla.decode_schedule(sl, num_heads=16, num_parts=4, batch_invariant=True)
    default = jax_mla.decode_schedule(sl, num_heads=16, num_parts=4)
    assert inv.shape[0] == default.shape[0] + _validate.INVARIANT_FIELDS
    with pytest.raises(ValueError, match="batch_invariant=True but this call has batch_invariant=False"):
        jax_mla.mla_decode(*args, schedule=inv)
    with pytest.raises(ValueError, match="batch_invariant=False but this call has batch_invariant=True"):
        jax_mla.mla_decode(*args, schedule=default, batch_invariant=True)
    # Under jit too (shapes only).
    with pytest.raises(ValueError, match="batch_invariant"):
        jax.jit(lambda s, *a: jax_mla.mla_decode(*a, schedule=s)).lower(inv, *args)
    # The same kind with another chunk is a different plan: the CPU handler's check names it.
    other = jax_mla.decode_schedule(sl, num_heads=16, num_parts=4, batch_invariant=True, invariant_chunk=64)
    with pytest.raises(Exception, match="invariant_chunk"):
        jax.block_until_ready(jax_mla.mla_decode(*args, schedule=other, batch_invariant=True))
    # Every other length is refused as before.
    with pytest.raises(ValueError, match="schedule must have shape"):
        jax_mla.mla_decode(*args, schedule=inv[:-1], batch_invariant=True)


def test_primitive_checks_chunk_blocks():
    from jax_mla._primitive import mla_decode_p, mla_decode_schedule_p
    q, kv, bt, sl = (jnp.asarray(x) for x in small_args())
    # (Not True: jax caches eager binds by their params, and True == 1 is a valid chunk.)
    for bad, exc in ((-1, ValueError), (2**30, ValueError), (1.5, TypeError)):
        with pytest.raises(exc, match="chunk_blocks"):
            mla_decode_p.bind(q, kv, bt, sl, jnp.zeros((0,), jnp.int32), softmax_scale=0.1, causal=False,
                              num_parts=4, kernel="auto", chunk_blocks=bad)
        with pytest.raises(exc, match="chunk_blocks"):
            mla_decode_schedule_p.bind(sl, num_parts=4, chunk_blocks=bad)
    # A schedule operand of the other kind's length is refused by the primitive's own check.
    with pytest.raises(ValueError, match="batch_invariant = True"):
        mla_decode_p.bind(q, kv, bt, sl, jnp.zeros((_validate.schedule_size(2, 4),), jnp.int32),
                          softmax_scale=0.1, causal=False, num_parts=4, kernel="auto", chunk_blocks=16)


def test_handler_checks_chunk_blocks():
    """The C++ check (ffi::Error) of the attribute, bypassing every Python check."""
    import jax.ffi
    q, kv, bt, sl = small_args()
    for bad in (-1, 2**30):
        call = jax.ffi.ffi_call("jax_mla_decode", (jax.ShapeDtypeStruct((2, 1, 16, 512), q.dtype),
                                                    jax.ShapeDtypeStruct((2, 1, 16), jnp.float32)))
        with pytest.raises(Exception, match="chunk_blocks"):
            jax.block_until_ready(call(q, kv, bt, sl, np.zeros((0,), np.int32), softmax_scale=np.float32(0.1),
                                       causal=False, num_parts=np.int32(4), kernel=np.int32(0),
                                       chunk_blocks=np.int32(bad)))
