"""The compiled extension module jax_mla._ext, loaded once with a helpful error.

Everything jax_mla takes from C++ comes through here: the FFI handlers (``ext.registrations()``),
the table of limits the handlers check (``LIMITS``, from cuda/runtime/limits.h), the values of
the ``kernel`` attribute (``KERNELS``), the kernels that read an FP8 cache (``FP8_KERNELS``), and
the CUDA device queries. Test and benchmark hooks live in ``jax_mla._ext.testing``, which the
package does not use.
"""

from __future__ import annotations

try:
    from . import _ext as ext
except ImportError as e:  # pragma: no cover - depends on how the package was installed
    raise ImportError(
        "jax_mla: the compiled extension module jax_mla._ext is missing or failed to load "
        f"({e}). Install the package with `python3 -m pip install .` so that it gets built. "
        "When running from the source checkout, its jax_mla/ folder (which has no compiled module) "
        "may shadow the installed package: run Python from another directory, or with -P.") from e

# {name: int}, e.g. LIMITS["MAX_SEQ_Q"]; _validate takes every bound it checks from here.
LIMITS: dict[str, int] = {str(k): int(v) for k, v in ext.limits().items()}
# {"auto": 0, "sm90": 1, "sm100": 2, "portable": 3}: values of jax_mla_decode's "kernel" attribute.
KERNELS: dict[str, int] = {str(k): int(v) for k, v in ext.KERNELS.items()}
# The CUDA kernels that read an FP8 kv_cache (cuda/runtime/kernel_select.h kReadsFp8Cache).
FP8_KERNELS: tuple[str, ...] = tuple(str(k) for k in ext.FP8_KERNELS)
