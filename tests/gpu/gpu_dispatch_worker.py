"""One process of tests/gpu/test_gpu_dispatch.py: JAX_MLA_KERNEL and JAX_MLA_SELFCHECK are read once
per process (at the first GPU initialization), so every environment gets a fresh one.

    JAX_MLA_SELFCHECK=fault python3 -P tests/gpu/gpu_dispatch_worker.py OUT.pkl [--info-first] KERNEL...

Runs one small case (several requests, a split one, an empty one) with each KERNEL ("auto",
"sm90", "portable", ...), in that order, and pickles into OUT.pkl: {"results": {kernel: (out, lse)
or the error message}, "info": jax_mla.kernel_info() of the GPU (or its error message), "ref": the
CPU reference}.
--info-first calls kernel_info() before any decode (it then initializes the device itself).
--sparse also runs mla_decode_sparse on a small case over a bf16 cache, an FP8 cache and that FP8
cache unpacked to q's dtype ("fp8_unpacked"), on the kernel auto picks under this environment
(SM90 gathers an FP8 cache's one-token pages; portable for a 16-bit cache, elsewhere or when
JAX_MLA_KERNEL says so), into "sparse": {cache: (out, lse) or the error message}, and its float64
reference into "sparse_ref".
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

CASE = cases.Case(lens=(1500, 0, 77, 300), s_q=2, h_q=64, page_size=32, causal=True, seed=9401)


def main() -> int:
    out_path, args = sys.argv[1], sys.argv[2:]
    info_first = "--info-first" in args
    kernels = [a for a in args if not a.startswith("--")]
    gpu = jax.devices("gpu")[0]
    result = {"results": {}}
    if info_first:
        result["info_before"] = jax_mla.kernel_info(gpu)
    data = cases.make(CASE)
    dev_args = [jax.device_put(x, gpu) for x in data.args]
    for kernel in kernels:
        try:
            fn = jax.jit(lambda *a, k=kernel: jax_mla.mla_decode(*a, causal=True, return_lse=True, kernel=k))
            out, lse = fn(*dev_args)
            result["results"][kernel] = (np.asarray(out), np.asarray(lse))
        except Exception as e:  # noqa: BLE001 - the test inspects the message
            result["results"][kernel] = f"{type(e).__name__}: {e}"
    try:  # raises when what auto would pick is an error (e.g. JAX_MLA_KERNEL=sm100 on 9.0)
        result["info"] = jax_mla.kernel_info(gpu)
    except Exception as e:  # noqa: BLE001 - the test inspects the message
        result["info"] = f"{type(e).__name__}: {e}"
    with jax.default_device(jax.devices("cpu")[0]):
        result["ref"] = cases.reference(data)
    if "--sparse" in args:
        result["sparse"] = {}
        for cache in ("bf16", "fp8", "fp8_unpacked"):
            with jax.default_device(jax.devices("cpu")[0]):
                q, kv, idx, rows64 = cases.make_sparse(9402, b=3, s_q=2, h_q=64, topk=300, num_pages=40,
                                                       page_size=16, fp8=cache != "bf16")
                if cache == "fp8_unpacked":  # the same FP8 cache as a 16-bit one, dequantized
                    kv = np.asarray(jax_mla.unpack_fp8_kv(kv, q.dtype))
            tl = np.array([300, 111, 0], np.int32)
            try:
                fn = jax.jit(lambda *a: jax_mla.mla_decode_sparse(*a[:3], topk_length=a[3], return_lse=True))
                out, lse = fn(*[jax.device_put(x, gpu) for x in (q, kv, idx, tl)])
                result["sparse"][cache] = (np.asarray(out), np.asarray(lse))
            except Exception as e:  # noqa: BLE001 - the test inspects the message
                result["sparse"][cache] = f"{type(e).__name__}: {e}"
            result.setdefault("sparse_ref", {})[cache] = cases.sparse_brute_force(q, rows64, idx, tl)
    with open(out_path, "wb") as f:
        pickle.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
