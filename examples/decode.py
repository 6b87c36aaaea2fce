"""A few decode steps of MLA attention over a paged latent cache, checked against the reference.

    python3 examples/decode.py                      # CPU, or the GPU when jax has one
    python3 examples/decode.py --device cpu --batch 8 --heads 128 --context 2048 --steps 5

Each step appends s_q new tokens per request to the paged cache (pages handed out in shuffled
order), runs jax_mla.mla_decode for two "layers" that share one decode_schedule, and compares
the result with jax_mla.reference.mla_decode_reference. Exits with status 1 on a mismatch.
"""

from __future__ import annotations

import argparse
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import jax_mla
from jax_mla.reference import mla_decode_reference

D_QK, D_V = 576, 512


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["auto", "cpu", "gpu"], default="auto")
    p.add_argument("--batch", type=int, default=4, help="requests (b)")
    p.add_argument("--heads", type=int, default=16, help="query heads (h_q), 1..128")
    p.add_argument("--seq-q", type=int, default=1, help="new tokens per request and step, 1..8")
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--context", type=int, default=1000, help="mean cached tokens before step 1")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    p.add_argument("--causal", action="store_true", help="causal mask among the s_q new tokens")
    p.add_argument("--softmax-scale", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tolerance", type=float, default=1e-2, help="max relative L2 error of out")
    return p.parse_args(argv)


def pick_device(kind):
    if kind in ("auto", "gpu"):
        try:
            return jax.devices("gpu")[0]
        except RuntimeError:
            if kind == "gpu":
                sys.exit("error: --device gpu but jax sees no GPU")
    return jax.devices("cpu")[0]


@jax.jit
def append_tokens(kv_cache, block_table, seq_lens, new_kv):
    """Writes new_kv (b, s_q, 576) at positions seq_lens .. seq_lens + s_q - 1 of each request."""
    page_size = kv_cache.shape[1]
    pos = seq_lens[:, None] + jnp.arange(new_kv.shape[1])[None, :]        # (b, s_q)
    pages = jnp.take_along_axis(block_table, pos // page_size, axis=1)     # (b, s_q)
    return kv_cache.at[pages, pos % page_size].set(new_kv), seq_lens + new_kv.shape[1]


def main(argv=None) -> int:
    a = parse_args(argv)
    device = pick_device(a.device)
    dtype = jnp.dtype(a.dtype)
    rng = np.random.default_rng(a.seed)
    b, h, s_q, page = a.batch, a.heads, a.seq_q, a.page_size

    # Requests start at different lengths; reserve pages for the whole run, in shuffled order.
    lens0 = rng.integers(a.context // 2, a.context * 3 // 2 + 1, size=b).astype(np.int32)
    max_len = int(lens0.max()) + a.steps * s_q
    max_pages = -(-max_len // page)
    num_pages = b * max_pages
    block_table = rng.permutation(num_pages).astype(np.int32).reshape(b, max_pages)
    kv_cache = np.zeros((num_pages, page, D_QK), dtype)
    for r in range(b):  # fill the first lens0[r] tokens of each request
        n = int(lens0[r])
        rows = rng.standard_normal((max_pages * page, D_QK)).astype(dtype)
        rows[n:] = 0
        kv_cache[block_table[r]] = rows.reshape(max_pages, page, D_QK)

    with jax.default_device(device):
        kv_cache = jax.device_put(kv_cache, device)
        block_table = jax.device_put(block_table, device)
        seq_lens = jax.device_put(lens0, device)

        @jax.jit
        def decode_step(q, kv_cache, block_table, seq_lens):
            # One schedule per step, shared by every layer (here: two layers, same cache).
            schedule = jax_mla.decode_schedule(seq_lens, num_heads=h, seq_q=s_q)
            outs = [jax_mla.mla_decode(q[i], kv_cache, block_table, seq_lens, causal=a.causal,
                                       softmax_scale=a.softmax_scale, return_lse=True,
                                       schedule=schedule) for i in range(2)]
            return outs

        reference = jax.jit(lambda q, kv, bt, sl: mla_decode_reference(
            q, kv, bt, sl, causal=a.causal, softmax_scale=a.softmax_scale, out_dtype=jnp.float32))

        print(f"jax {jax.__version__}, jax_mla {jax_mla.__version__}, backend {device.platform} "
              f"({device.device_kind})")
        print(f"q ({b}, {s_q}, {h}, {D_QK}) {a.dtype}, kv_cache ({num_pages}, {page}, {D_QK}), "
              f"block_table ({b}, {max_pages}), causal={a.causal}, 2 layers per step")
        times, worst = [], 0.0
        for step in range(a.steps):
            new_kv = jnp.asarray(rng.standard_normal((b, s_q, D_QK)), dtype)
            kv_cache, seq_lens = append_tokens(kv_cache, block_table, seq_lens, new_kv)
            q = jnp.asarray(rng.standard_normal((2, b, s_q, h, D_QK)), dtype)
            jax.block_until_ready(decode_step(q, kv_cache, block_table, seq_lens))  # compile/warm
            t0 = time.perf_counter()
            outs = jax.block_until_ready(decode_step(q, kv_cache, block_table, seq_lens))
            times.append(time.perf_counter() - t0)
            for layer, (out, lse) in enumerate(outs):
                ref_out, ref_lse = (np.asarray(x, np.float64)
                                    for x in reference(q[layer], kv_cache, block_table, seq_lens))
                out, lse = np.asarray(out, np.float64), np.asarray(lse, np.float64)
                if not (np.isfinite(out).all() and np.array_equal(np.isfinite(lse), np.isfinite(ref_lse))):
                    print(f"step {step} layer {layer}: non-finite values in the output")
                    return 1
                rel = np.linalg.norm(out - ref_out) / max(np.linalg.norm(ref_out), 1e-30)
                fin = np.isfinite(ref_lse)
                lse_err = float(np.abs(lse[fin] - ref_lse[fin]).max()) if fin.any() else 0.0
                worst = max(worst, rel)
                if layer == 0:
                    lens = np.asarray(seq_lens)
                    print(f"step {step}: seq_lens {lens.min()}..{lens.max()}, "
                          f"max |out - ref| {np.abs(out - ref_out).max():.2e}, rel L2 {rel:.2e}, "
                          f"max |lse - ref| {lse_err:.2e}, {times[-1] * 1e3 / 2:.3f} ms per layer")
                if rel > a.tolerance or lse_err > 1e-3 * max(1.0, float(np.abs(ref_lse[fin]).max(initial=0))):
                    print(f"MISMATCH at step {step}, layer {layer}: rel L2 error {rel:.3e} "
                          f"(tolerance {a.tolerance}), lse error {lse_err:.3e}")
                    return 1
        print(f"OK: {a.steps} steps on {device.platform}, worst relative L2 error {worst:.2e}, "
              f"median {np.median(times) * 1e3 / 2:.3f} ms per decode call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
