"""benchmarks/bench_peers.py's own checks, on the CPU: its float64 reference computes mla_decode's
semantics (so a peer that disagrees with it is wrong, not the reference), and every config gets a
step of a few milliseconds."""

from __future__ import annotations

import os
import sys

import jax.numpy as jnp
import numpy as np
import pytest

import jax_mla
from script_loader import ROOT, load_script

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
bench_peers = load_script("benchmarks/bench_peers.py")
configs = load_script("benchmarks/configs.py")


@pytest.mark.parametrize("causal", [False, True])
def test_reference_matches_mla_decode(causal):
    rng = np.random.default_rng(7)
    b, s_q, h, num_pages = 3, 3, 16, 9
    lens = np.array([70, 3, 129], np.int32)  # a partial page, shorter than s_q + a page, two pages + 1
    page = bench_peers.PAGE_SIZE
    cache = jnp.asarray(rng.standard_normal((num_pages, page, 576)), jnp.bfloat16)
    q = jnp.asarray(rng.standard_normal((b, s_q, h, 576)), jnp.bfloat16)
    table = np.stack([rng.permutation(num_pages)[:3] for _ in range(b)]).astype(np.int32)
    out, lse = jax_mla.mla_decode(q, cache, jnp.asarray(table), jnp.asarray(lens), causal=causal, return_lse=True)
    q64, cache64 = np.asarray(q, np.float64), np.asarray(cache, np.float64)
    for r in range(b):
        ref_o, ref_l = bench_peers.reference_request(q64[r], cache64, table[r], int(lens[r]), causal, 576 ** -0.5)
        got = np.asarray(out[r], np.float64)
        assert np.linalg.norm(got - ref_o) / np.linalg.norm(ref_o) < 1e-2
        np.testing.assert_allclose(np.asarray(lse[r]), ref_l, atol=1e-4)
    # The mask matters here: a reference without it (or with another alignment) is caught.
    if causal:
        ref_o, _ = bench_peers.reference_request(q64[1], cache64, table[1], int(lens[1]), False, 576 ** -0.5)
        assert np.linalg.norm(np.asarray(out[1], np.float64) - ref_o) / np.linalg.norm(ref_o) > 0.1


def test_calls_per_step_fill_a_few_milliseconds():
    for cfg in configs.CONFIGS:
        calls = cfg.calls_per_step(3000.0, 800.0)
        assert 16 <= calls <= 128
        assert calls * cfg.floor_us(3000.0, 800.0) >= 3000.0 or calls == 128
