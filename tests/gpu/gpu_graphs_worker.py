"""A jitted decode step run for several steps on the GPU (used by tests/gpu/test_gpu_graphs.py).

    XLA_FLAGS="--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL --xla_gpu_graph_min_graph_size=1" \
        python3 -P tests/gpu/gpu_graphs_worker.py OUT.pkl

Each step appends one token per request with update_kv_cache (cache donated), plans one
decode_schedule and runs mla_decode for two "layers". Between steps seq_lens, the block table and
q change (same shapes, so the same executable, and with command buffers the same CUDA graph, is
replayed with new values). Every step is checked here against the fp32 reference on the CPU
(attention) and against a NumPy update (cache). OUT.pkl receives the results of every step and
the optimized HLO text, for the test to compare runs with and without command buffers.

With JAX_MLA_GRAPHS_FP8=1 the cache is an FP8 one (uint8 rows of 656 bytes): the update quantizes
float32 tokens (pack_fp8_kv) and the expected cache holds the rows pack_fp8_kv makes on the CPU.
"""

from __future__ import annotations

import os
import pickle
import sys

# cases.py is in tests/, one folder up.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

import cases  # noqa: E402
import jax_mla  # noqa: E402

B, H_Q, PAGE, MAX_PAGES, STEPS = 8, 16, 64, 12, 5
NUM_PAGES = B * MAX_PAGES + 4
D = cases.HEAD_DIM_QK
FP8 = os.environ.get("JAX_MLA_GRAPHS_FP8", "") == "1"


def packed(rows):
    """FP8 rows of float32 rows, packed on the CPU (the expected bits)."""
    with jax.default_device(jax.devices("cpu")[0]):
        return np.asarray(jax_mla.pack_fp8_kv(rows))


def step(q, kv_cache, block_table, seq_lens, new_latent):
    kv_cache = jax_mla.update_kv_cache(kv_cache, new_latent, block_table, seq_lens[:, None])
    seq_lens = seq_lens + 1
    schedule = jax_mla.decode_schedule(seq_lens, num_heads=H_Q)
    out1, lse1 = jax_mla.mla_decode(q, kv_cache, block_table, seq_lens, return_lse=True,
                                    schedule=schedule)
    out2, lse2 = jax_mla.mla_decode(-q, kv_cache, block_table, seq_lens, return_lse=True,
                                    schedule=schedule)
    return out1, lse1, out2, lse2, kv_cache


def inputs(k, rng):
    """Step k's q, block table (a fresh page assignment), lengths (each < capacity) and tokens."""
    q = rng.standard_normal((B, 1, H_Q, D)).astype(np.dtype("bfloat16"))
    table = rng.permutation(NUM_PAGES)[:B * MAX_PAGES].astype(np.int32).reshape(B, MAX_PAGES)
    lens = rng.integers(0, MAX_PAGES * PAGE, size=B).astype(np.int32)  # the new token fits
    lens[k % B] = 0 if k % 2 else PAGE - 1  # an empty request, a page boundary
    new = rng.standard_normal((B, 1, D)).astype(np.float32 if FP8 else q.dtype)
    return q, table, lens, new


def expected_cache(kv, table, lens, new):
    want = kv.copy()
    rows = packed(new) if FP8 else new
    for r in range(B):
        p = int(lens[r])
        want[table[r, p // PAGE], p % PAGE] = rows[r, 0]
    return want


def main(out_path: str) -> int:
    gpu, cpu = jax.devices("gpu")[0], jax.devices("cpu")[0]
    rng = np.random.default_rng(2024)
    kv_host = rng.standard_normal((NUM_PAGES, PAGE, D)).astype(np.dtype("bfloat16"))
    if FP8:
        kv_host = packed(kv_host.astype(np.float32))
    fn = jax.jit(step, donate_argnums=1)
    kv = jax.device_put(kv_host, gpu)
    q, table, lens, new = inputs(0, rng)
    hlo = fn.lower(q, kv, table, lens, new).compile().as_text()
    results = []
    for k in range(STEPS):
        if k:
            q, table, lens, new = inputs(k, rng)
        args = [jax.device_put(x, gpu) for x in (q, table, lens, new)]
        out1, lse1, out2, lse2, kv = fn(args[0], kv, *args[1:])
        kv_now = np.asarray(kv)
        np.testing.assert_array_equal(kv_now.view(np.uint8),
                                      expected_cache(kv_host, table, lens, new).view(np.uint8),
                                      err_msg=f"step {k}: cache update")
        kv_host = kv_now
        with jax.default_device(cpu):
            for q_layer, out, lse in ((q, out1, lse1), (-q, out2, lse2)):
                ref_out, ref_lse = jax.jit(jax_mla.reference.mla_decode_reference)(
                    q_layer, kv_now, table, lens + 1)
                cases.assert_close_rel_l2(np.asarray(out), np.asarray(lse), np.asarray(ref_out),
                                          np.asarray(ref_lse), out_tol=1e-2, lse_tol=1e-3)
        results.append([np.asarray(x) for x in (out1, lse1, out2, lse2)])
        print(f"step {k}: ok (seq_lens {lens.tolist()})", flush=True)
    stats = jax_mla._ext.testing.cuda_call_stats()
    print(f"decode handler: {stats}", flush=True)
    with open(out_path, "wb") as f:
        pickle.dump({"results": results, "hlo": hlo, "xla_flags": os.environ.get("XLA_FLAGS", ""),
                     "stats": stats}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
