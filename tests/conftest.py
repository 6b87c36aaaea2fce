"""pytest configuration for jax_mla's tests (kept here, not in pyproject.toml).

Marker `gpu`: the test needs a CUDA device. Without one it is skipped, unless the environment
variable JAX_MLA_REQUIRE_GPU=1 is set (GPU CI), which turns the skip into a failure.
"""

from __future__ import annotations

import functools
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # `import cases` from the test modules


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "gpu: needs a CUDA device (skipped without one unless JAX_MLA_REQUIRE_GPU=1)")


@functools.lru_cache(maxsize=None)
def gpu_devices():
    import jax

    try:
        return tuple(jax.devices("gpu"))
    except RuntimeError:
        return ()


def pytest_runtest_setup(item):
    if item.get_closest_marker("gpu") is None:
        return
    if gpu_devices():
        return
    if os.environ.get("JAX_MLA_REQUIRE_GPU", "") == "1":
        pytest.fail("JAX_MLA_REQUIRE_GPU=1 but jax sees no GPU device "
                    "(is the jax CUDA plugin installed and a GPU visible?)", pytrace=False)
    pytest.skip("no GPU device visible to jax (set JAX_MLA_REQUIRE_GPU=1 to make this a failure)")
