"""pytest configuration for jax_mla's tests (kept here, not in pyproject.toml).

Marker `gpu`: the test needs a CUDA device. Without one it is skipped, unless the environment
variable JAX_MLA_REQUIRE_GPU=1 is set (GPU CI), which turns the skip into a failure.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(TESTS)
sys.path.insert(0, TESTS)  # `import cases`, `import script_loader` from the test modules in any subfolder


def _prefer_installed_jax_mla():
    """`python3 -m pytest` puts the checkout's root first on sys.path, so its jax_mla/ folder,
    which has no compiled extension unless built in place, would shadow the installed package.
    Drop the root from sys.path when an installed jax_mla exists and the source has no _ext."""
    src = os.path.join(ROOT, "jax_mla")
    if not os.path.isdir(src) or any(f.startswith("_ext.") for f in os.listdir(src)):
        return
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != ROOT]
    spec = importlib.util.find_spec("jax_mla")
    if spec is None:  # not installed: let the import fail with jax_mla's own message
        sys.path[:] = saved


_prefer_installed_jax_mla()


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "gpu: needs a CUDA device (skipped without one unless JAX_MLA_REQUIRE_GPU=1)")


@pytest.fixture
def on_cpu():
    """Runs the test with the CPU as jax's default device, on a GPU machine too. A module whose
    tests all need it says so with `pytestmark = pytest.mark.usefixtures("on_cpu")`."""
    import jax

    with jax.default_device(jax.devices("cpu")[0]):
        yield


@pytest.fixture(scope="session")
def cpu_devices_env():
    """env(n): this process's environment for a subprocess that runs jax on n CPU devices
    (JAX_PLATFORMS=cpu, XLA_FLAGS plus --xla_force_host_platform_device_count=n). The flag must be
    set before jax initialises, which in the pytest process has already happened."""
    def env(n: int) -> dict[str, str]:
        flags = os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={n}"
        return dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=flags.strip())

    return env


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
