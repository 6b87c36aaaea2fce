"""One process of tests/gpu/test_gpu_watchdog.py (a fresh CUDA context, which the watchdog test must
prove usable after a kernel hang):

    python3 -P tests/gpu/gpu_watchdog_worker.py OUT.pkl KERNEL WATCHDOG_MS

1. runs KERNEL's self-check (jax_mla._ext.testing.run_self_check) with mode 'hang': one barrier
   arrival of the candidate is withheld by the shared KV producer, so it would wait forever without
   its watchdog;
2. runs the same self-check again with mode 'force' on the same context;
3. decodes one small case with kernel="auto", KERNEL and "portable".
Pickles {"hang": report, "force": report, "results": {kernel: (out, lse) or the error}, "ref": the
CPU reference, "info": jax_mla.kernel_info()}. Exceptions of steps 1-2 are recorded as strings.
"""

from __future__ import annotations

import os
import pickle
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

import cases  # noqa: E402
import jax_mla  # noqa: E402
from jax_mla._ext import testing  # noqa: E402

CASE = cases.Case(lens=(1500, 0, 77, 300), s_q=2, h_q=64, page_size=32, causal=True, seed=9411)


def main() -> int:
    out_path, kernel, watchdog_ms = sys.argv[1], sys.argv[2], float(sys.argv[3])
    gpu = jax.devices("gpu")[0]
    result = {"results": {}}
    for mode in ("hang", "force"):
        try:
            result[mode] = testing.run_self_check(gpu.id, kernel, mode, watchdog_ms)
        except Exception as e:  # noqa: BLE001 - the test inspects the message
            result[mode] = f"{type(e).__name__}: {e}"
    data = cases.make(CASE)
    dev_args = [jax.device_put(x, gpu) for x in data.args]
    for k in ("auto", kernel, "portable"):
        try:
            out, lse = jax_mla.mla_decode(*dev_args, causal=True, return_lse=True, kernel=k)
            result["results"][k] = (np.asarray(out), np.asarray(lse))
        except Exception as e:  # noqa: BLE001
            result["results"][k] = f"{type(e).__name__}: {e}"
    result["info"] = jax_mla.kernel_info(gpu)
    with jax.default_device(jax.devices("cpu")[0]):
        result["ref"] = cases.reference(data)
    with open(out_path, "wb") as f:
        pickle.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
