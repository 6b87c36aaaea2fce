"""Whether this process's decode calls ran on the SM90 shape that JAX_MLA_SM90_NARROW asks for (the
narrow or a transposed kernel): used by the GPU scripts that run with such a variable set
(gpu_narrow_worker.py, gpu_sanitize_cases.py), so a misspelt or unread variable, or a fallback to
another kernel, fails them instead of testing the wide kernel in its place. Not collected by pytest."""

from __future__ import annotations

import os

import jax_mla


def shape_check_failure() -> str | None:
    """None when fine (no shape requested, not an SM90 GPU, or launches on the requested shape);
    otherwise the reason. Call after the decode calls."""
    shape = os.environ.get("JAX_MLA_SM90_NARROW", "0")
    if shape == "1":
        key = "sm90_narrow_launches"
    elif shape.startswith("transposed"):
        key = "sm90_transposed_launches"
    else:
        return None
    info = jax_mla.kernel_info()
    if tuple(info.get("compute_capability") or ()) != (9, 0):
        return None  # only SM90 has the shapes; elsewhere the variable changes nothing
    stats = jax_mla._ext.cuda_call_stats()
    if info.get("fell_back") or info.get("kernel") != "sm90" or not stats.get(key):
        return f"JAX_MLA_SM90_NARROW={shape} but no launch on that shape: {stats}, kernel_info {info}"
    return None
