"""Smoke check of the Bazel-built package: imports jax_mla's Bazel-built extension (not an installed
copy), checks the registered FFI targets, runs one small mla_decode on the CPU against the
reference, and loads libjax_mla_ffi.so's handler symbols with ctypes. Two ways to run it:

    bazel test //:smoke_test                       (the py_library's runfiles; python3 on PATH)
    bazel build //:site //:libjax_mla_ffi.so && PYTHONPATH=bazel-bin/site python3 -P bazel/smoke.py

--cuda: also require the CUDA handlers (the smoke_test target passes it when nvcc was found).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ffi-lib", default="bazel-bin/libjax_mla_ffi.so")
    p.add_argument("--cuda", action="store_true", help="require the CUDA handlers")
    a = p.parse_args()

    import jax
    import jax.numpy as jnp
    import numpy as np

    import jax_mla
    from jax_mla import _ext
    from jax_mla.reference import mla_decode_reference

    where = os.path.realpath(_ext.__file__)
    print(f"jax {jax.__version__}; jax_mla._ext from {where}")
    if f"{os.sep}bazel-out{os.sep}" not in where:
        print("FAIL: jax_mla._ext is not the Bazel-built one (not under bazel-out/)")
        return 1

    regs = _ext.registrations()
    print("registrations:", {k: sorted(v) for k, v in regs.items()}, "has_cuda:", _ext.has_cuda())
    want = {"cpu"} | ({"CUDA"} if a.cuda else set())
    if not want <= set(regs) or (a.cuda and not _ext.has_cuda()):
        print(f"FAIL: expected handlers for {sorted(want)}")
        return 1

    # One small paged decode on the CPU, checked against the plain jax.numpy reference.
    rng = np.random.default_rng(0)
    b, s_q, h, page, pages_per_req = 2, 1, 16, 16, 3
    q = jnp.asarray(rng.standard_normal((b, s_q, h, 576)), jnp.bfloat16)
    kv = jnp.asarray(rng.standard_normal((b * pages_per_req, page, 576)), jnp.bfloat16)
    table = jnp.asarray(rng.permutation(b * pages_per_req).reshape(b, pages_per_req), jnp.int32)
    lens = jnp.asarray([37, 5], jnp.int32)
    cpu = jax.devices("cpu")[0]
    q, kv, table, lens = (jax.device_put(x, cpu) for x in (q, kv, table, lens))
    out, lse = jax.jit(lambda *x: jax_mla.mla_decode(*x, return_lse=True))(q, kv, table, lens)
    ref, ref_lse = mla_decode_reference(q, kv, table, lens, out_dtype=jnp.float32)
    err = float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref)))
    lse_err = float(jnp.max(jnp.abs(lse - ref_lse)))
    print(f"mla_decode on {out.devices()}: out {out.shape} {out.dtype}, max |out - ref| {err:.2e}, "
          f"max |lse - ref| {lse_err:.2e}")
    if not (err < 2e-2 and lse_err < 1e-3):
        print("FAIL: result differs from the reference")
        return 1

    lib_path = os.path.abspath(a.ffi_lib)
    lib = ctypes.CDLL(lib_path)
    names = ["MlaDecodeCpu", "MlaDecodeScheduleCpu", "MlaDecodeSparseCpu"]
    if a.cuda:
        names += ["MlaDecodeCudaInitialize", "MlaDecodeCudaExecute", "MlaDecodeScheduleCudaExecute",
                  "MlaDecodeSparseCudaExecute"]
    for n in names:
        jax.ffi.pycapsule(getattr(lib, n))  # AttributeError if not exported
    print(f"{os.path.basename(lib_path)} exports {', '.join(names)}")
    print("Bazel smoke check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
