"""mla_decode(..., batch_invariant=True) on the GPU kernels: a request's out and lse are bitwise the
same alone and anywhere in batches of 1 .. 256 random others, for every kernel the device runs
(kernel="sm90", "sm100", "portable"; "auto" is one of them), with the op's own schedule and with
decode_schedule's; the device scheduler writes the host's invariant plan; the SM90 in-kernel merge
and the combine kernel give the same bits; the default plans are untouched. The CPU twin is
tests/cpu/test_batch_invariant.py.

Run on an H100 / H200 with:  JAX_MLA_REQUIRE_GPU=1 python -m pytest -q tests/gpu/test_gpu_batch_invariant.py
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import cases
import invariance
import jax_mla
from jax_mla import _ext, _validate

pytestmark = pytest.mark.gpu

BLOCK_N = _validate.BLOCK_N


def gpu():
    return jax.devices("gpu")[0]


def runnable_kernels():
    """The kernels this device and build can run: sm90 on 9.0, sm100 on 10.x (when built), portable."""
    info = jax_mla.kernel_info()
    cc = tuple(info["compute_capability"])
    ks = []
    if cc == (9, 0) and "sm90" in info["built"]:
        ks.append("sm90")
    if cc[0] == 10 and ({"sm100", "sm103"} & set(info["built"])):
        ks.append("sm100")
    return ks + ["portable"]


KERNEL_OPTIONS = ("auto", "sm90", "sm100", "portable")


def skip_unless_runnable(kernel):
    if kernel != "auto" and kernel not in runnable_kernels():
        pytest.skip(f"kernel {kernel!r} does not run on this device / build")


def runner(cfg, kernel, batch_invariant=True, invariant_chunk=None, num_parts=None, pass_schedule=True,
           fp8=False):
    def run(q, kv, bt, sl):
        if fp8:
            # The batch's cache as FP8 rows, packed on the host: per token, so a target's rows are
            # the same bytes in every batch.
            with jax.default_device(jax.devices("cpu")[0]):
                kv = np.asarray(jax_mla.pack_fp8_kv(kv))
        args = [jax.device_put(x, gpu()) for x in (q, kv, bt, sl)]
        kw = dict(causal=cfg.causal, return_lse=True, batch_invariant=batch_invariant, kernel=kernel)
        if invariant_chunk is not None:
            kw["invariant_chunk"] = invariant_chunk
        with jax.default_device(gpu()):
            if pass_schedule or num_parts is not None:
                kw["schedule"] = jax_mla.decode_schedule(args[3], num_heads=cfg.h_q, seq_q=cfg.s_q,
                                                         num_parts=num_parts, batch_invariant=batch_invariant,
                                                         invariant_chunk=invariant_chunk)
            out, lse = jax_mla.mla_decode(*args, **kw)
        return np.asarray(out), np.asarray(lse)
    return run


# (config, mla_decode keyword arguments, batch sizes (others); None: invariance.batch_sizes())
CONFIGS = [
    (invariance.Config(target_lens=(0, 1, 63, 64, 65, 1023, 1024, 1025, 3001, 5000, 9000, 40000), h_q=16,
                       other_long=20000, seed=11), {}, None),
    # Two row blocks (DeepSeek's 128 heads), the default num_parts: the SM90 in-kernel merge runs.
    (invariance.Config(target_lens=(1, 700, 4096, 4097, 32768), h_q=128, other_long=9000, seed=12), {}, None),
    # s_q = 2 causal, pages of 16, fp16, a small chunk and few parts (the cap of num_parts chunks).
    (invariance.Config(target_lens=(0, 2, 129, 500, 2000, 7001), s_q=2, h_q=64, page_size=16, dtype="float16",
                       causal=True, other_long=5000, seed=13), dict(invariant_chunk=128, num_parts=5), None),
    # One row block and many parts (h_q = 64 on 132 parts), pages of 256 tokens.
    (invariance.Config(target_lens=(3, 4096, 16385), h_q=64, page_size=256, other_long=12000, seed=14), {}, None),
]
CONFIG_IDS = ["h16", "h128", "sq2-causal-chunk128-parts5", "h64-page256"]


@pytest.mark.parametrize("kernel", KERNEL_OPTIONS)
@pytest.mark.parametrize("cfg,kw,sizes", CONFIGS, ids=CONFIG_IDS)
def test_request_bits_do_not_depend_on_the_batch(kernel, cfg, kw, sizes):
    """Batches alternate between the op's own schedule and decode_schedule's (the same bits)."""
    skip_unless_runnable(kernel)
    runs = [runner(cfg, kernel, pass_schedule=True, **kw)]
    if "num_parts" not in kw:
        runs.append(runner(cfg, kernel, pass_schedule=False, **kw))
    for t in invariance.targets(cfg):  # alone: close to the reference
        out, lse = runs[0](*t.data.args)
        with jax.default_device(jax.devices("cpu")[0]):
            ref = cases.reference(t.data)
        cases.assert_close_rel_l2(out, lse, *ref, out_tol=1e-2, lse_tol=1e-3)
    invariance.check_invariant(runs, cfg, sizes=sizes, seed=cfg.seed, pool=True, bucket=True)


@pytest.mark.skipif(not cases.gpu_fp8_reader(), reason=cases.NO_GPU_FP8_READER)
@pytest.mark.parametrize("kernel", [k for k in KERNEL_OPTIONS if k in ("auto", "portable")])
def test_fp8_cache_bits_do_not_depend_on_the_batch(kernel):
    """The same contract over an FP8 cache, on the kernels that read it (auto picks portable):
    only the rows' loading differs, not the plan or the merge."""
    cfg = invariance.Config(target_lens=(0, 1, 65, 1025, 3001, 9000), h_q=64, other_long=9000, seed=17)
    runs = [runner(cfg, kernel, pass_schedule=True, fp8=True), runner(cfg, kernel, pass_schedule=False, fp8=True)]
    invariance.check_invariant(runs, cfg, seed=cfg.seed, pool=True, bucket=True)


@pytest.mark.parametrize("kernel", KERNEL_OPTIONS)
def test_without_the_flag_the_bits_do_change(kernel):
    """The comparison above can fail: with the default plans some request's bits move."""
    skip_unless_runnable(kernel)
    cfg, _, _ = CONFIGS[0]
    found = invariance.find_difference(runner(cfg, kernel, batch_invariant=False), cfg, seed=cfg.seed, pool=True,
                                       bucket=True)
    assert found is not None
    print(kernel, "default plans:", found)


def test_in_kernel_merge_and_combine_kernel_give_the_same_bits():
    """SM90: with 66 parts of two row blocks the grid fits the GPU and the decode kernel merges the
    chunks itself; with 67 it does not and the combine kernel merges them. The invariant plan lists
    every split request in the combine's few-split class, whose arithmetic the in-kernel merge
    shares, so the bits agree (requests of at most 66 chunks have the same chunks in both)."""
    if "sm90" not in runnable_kernels():
        pytest.skip("the in-kernel merge is an SM90 path")
    if jax_mla._api.default_num_parts(1, 128) != 66:
        pytest.skip("needs a 132-SM GPU (H100 SXM / H200)")
    cfg = invariance.Config(target_lens=(1, 700, 4096, 9000, 40000), h_q=128, other_long=30000, seed=15)
    tgts = invariance.targets(cfg)
    rng = np.random.default_rng(3)
    bt = invariance.batch(rng, cfg, tgts, 40, 0, "middle", pool=invariance.key_pool(rng, cfg))
    results = {}
    for parts in (66, 67):
        before = _ext.testing.cuda_call_stats()["sm90_fused_merge_launches"]
        results[parts] = runner(cfg, "sm90", num_parts=parts)(*bt.args)
        fused = _ext.testing.cuda_call_stats()["sm90_fused_merge_launches"] - before
        assert fused == (1 if parts == 66 else 0), (parts, fused)
    np.testing.assert_array_equal(results[66][0], results[67][0])
    np.testing.assert_array_equal(results[66][1], results[67][1])


@pytest.mark.parametrize("kernel", ("sm90", "sm100", "portable"))
def test_gpu_bits_do_not_depend_on_num_parts_below_the_cap(kernel):
    skip_unless_runnable(kernel)
    cfg = invariance.Config(target_lens=(4000, 100, 1), other_long=4096, seed=16)
    tgts = invariance.targets(cfg)
    rng = np.random.default_rng(4)
    bt = invariance.batch(rng, cfg, tgts, 30, 1, "first", pool=invariance.key_pool(rng, cfg))
    results = [runner(cfg, kernel, num_parts=n)(*bt.args) for n in (4, 33, 132, 150)]
    for out, lse in results[1:]:
        np.testing.assert_array_equal(out, results[0][0])
        np.testing.assert_array_equal(lse, results[0][1])


# Batch sizes at and around every change of the scheduler's CTA shape (128, 1024) and its limit.
SCHEDULE_BATCHES = (1, 2, 31, 32, 33, 127, 128, 129, 255, 1000, 1024, 1025, 4097, 16384)


@pytest.mark.parametrize("b", SCHEDULE_BATCHES)
def test_device_invariant_schedule_equals_host_plan(b):
    rng = np.random.default_rng(9500 + b)
    kinds = np.array([0, 1, 63, 64, 65, 300, 1000, 1024, 1025, 4096, 30000, 131072])
    batches = {
        "random": np.where(rng.random(b) < 0.5, rng.choice(kinds, b), rng.integers(0, 20000, b)),
        "all_empty": np.zeros(b),
        "uniform": np.full(b, 4096),
        "one_long": np.concatenate([[131072], rng.choice([0, 64], b - 1)]),
    }
    for name, lens in batches.items():
        lens = lens.astype(np.int32)
        for num_parts in (1, 7, 66, 132):
            for chunk in (1, 16, 64):
                with jax.default_device(gpu()):
                    dev = jax_mla.decode_schedule(jax.device_put(lens, gpu()), num_heads=16, num_parts=num_parts,
                                                  batch_invariant=True, invariant_chunk=chunk * BLOCK_N)
                np.testing.assert_array_equal(np.asarray(dev), _ext.testing.plan_schedule(lens, num_parts, chunk),
                                              err_msg=f"{name} b={b} num_parts={num_parts} chunk={chunk}")


def test_default_plans_are_untouched():
    """batch_invariant=False keeps the default plans' schedule layout and their device / host
    agreement; the default schedule carries no chunk fields."""
    lens = np.array([0, 1, 5000, 64, 65, 30000], np.int32)
    for num_parts in (7, 66, 132):
        with jax.default_device(gpu()):
            dev = np.asarray(jax_mla.decode_schedule(jax.device_put(lens, gpu()), num_heads=16, num_parts=num_parts))
        np.testing.assert_array_equal(dev, _ext.testing.plan_schedule(lens, num_parts))
        assert dev.shape == (_validate.schedule_size(len(lens), num_parts),)
        assert (dev[:num_parts * 8].reshape(num_parts, 8)[:, 5:] == 0).all()
