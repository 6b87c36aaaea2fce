"""One process of tests/gpu/test_gpu_dispatch.py: JAX_MLA_KERNEL and JAX_MLA_SELFCHECK are read once
per process (at the first GPU initialization), so every environment gets a fresh one.

    JAX_MLA_SELFCHECK=fault python3 -P tests/gpu/gpu_dispatch_worker.py OUT.pkl [--info-first] KERNEL...

Runs one small case (several requests, a split one, an empty one) with each KERNEL ("auto",
"sm90", "portable", ...), in that order, and pickles into OUT.pkl: {"results": {kernel: (out, lse)
or the error message}, "info": jax_mla.kernel_info() of the GPU (or its error message), "ref": the
CPU reference}.
--info-first calls kernel_info() before any decode (it then initializes the device itself).
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
    with open(out_path, "wb") as f:
        pickle.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
