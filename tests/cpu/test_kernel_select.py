"""Kernel selection and the `kernel` argument, on the CPU.

The CUDA handler's choice (cuda/runtime/kernel_select.h) is a pure function exposed as
jax_mla._ext.testing.select_kernel: it is checked here against the documented rules for every
combination of compute capability, kernel argument, JAX_MLA_KERNEL, JAX_MLA_SELFCHECK, kernels in the
build and self-check outcome, plus hand-picked cases with their exact messages. The argument itself is
validated at trace time (same words as the handlers' check of the attribute) and ignored on the CPU.
"""

from __future__ import annotations

import itertools

import jax
import numpy as np
import pytest

import cases
import jax_mla
from jax_mla import _ext, _validate

NAMES = ("auto", "sm90", "sm100", "portable")
CHOICES = "'auto', 'sm90', 'sm100', 'portable'"


pytestmark = pytest.mark.usefixtures("on_cpu")  # jax's default device: the CPU (conftest.py)


def select(cc, kernel="auto", env=None, self_check="not run", built=("sm90",), mode="", fp8=False):
    attr = _ext.KERNELS[kernel] if isinstance(kernel, str) else kernel
    return _ext.testing.select_kernel(cc[0], cc[1], attr, env=env, self_check=self_check, built=list(built),
                                      self_check_mode=mode, fp8_cache=fp8)


def test_kernel_ids_mirror_the_extension():
    assert _ext.KERNELS == _validate.KERNELS == {n: i for i, n in enumerate(NAMES)}


# ----------------------------------------------------------------------------------------------
# Hand-picked cases
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cc, want", [((8, 0), "portable"), ((8, 6), "portable"), ((8, 9), "portable"),
                                      ((9, 0), "sm90"), ((12, 0), "portable"), ((12, 1), "portable"),
                                      ((11, 0), "portable"), ((10, 0), "portable"), ((9, 1), "portable")])
def test_auto_by_compute_capability(cc, want):
    # The default build here: SM90 kernel, no SM100 kernel yet.
    assert select(cc) == dict(kernel=want, fell_back=False, needs_self_check=False)


def test_auto_on_sm100_needs_the_self_check():
    built = ("sm90", "sm100", "sm103")
    for cc in ((10, 0), (10, 3)):
        assert select(cc, built=built) == dict(kernel=None, fell_back=False, needs_self_check=True)
        assert select(cc, built=built, self_check="passed")["kernel"] == "sm100"
        assert select(cc, built=built, self_check="failed") == dict(kernel="portable", fell_back=True,
                                                                   needs_self_check=False)
    assert _ext.testing.auto_candidate(10, 0, built=list(built)) == ("sm100", True)
    assert _ext.testing.auto_candidate(10, 3, built=["sm100"]) == ("portable", False)  # no sm_103a cubin
    assert select((10, 3), built=("sm100",))["kernel"] == "portable"
    assert select((10, 1), built=built)["kernel"] == "portable"  # arch-specific cubins run on 10.0 / 10.3 only


def test_sm90_self_check_only_when_forced():
    assert _ext.testing.auto_candidate(9, 0) == ("sm90", False)
    for mode in ("force", "fault", "hang"):
        assert _ext.testing.auto_candidate(9, 0, self_check_mode=mode) == ("sm90", True)
        assert select((9, 0), mode=mode)["needs_self_check"]
        assert select((9, 0), mode=mode, self_check="passed")["kernel"] == "sm90"
        assert select((9, 0), mode=mode, self_check="failed") == dict(kernel="portable", fell_back=True,
                                                                     needs_self_check=False)
    # Forcing changes nothing where auto has no candidate to check.
    assert _ext.testing.auto_candidate(8, 6, self_check_mode="force") == ("portable", False)
    with pytest.raises(ValueError, match="JAX_MLA_SELFCHECK must be one of 'force', 'fault', 'hang' \\(or unset\\), got 'on'"):
        _ext.testing.auto_candidate(9, 0, self_check_mode="on")


def test_explicit_requests_and_their_errors():
    assert select((8, 6), "portable")["kernel"] == "portable"
    assert select((9, 0), "portable")["kernel"] == "portable"
    assert select((9, 0), "sm90")["kernel"] == "sm90"
    # Explicit requests skip the self-check, even a failed one.
    assert select((9, 0), "sm90", mode="fault", self_check="failed")["kernel"] == "sm90"
    assert select((10, 0), "sm100", built=("sm100",), self_check="failed")["kernel"] == "sm100"
    with pytest.raises(ValueError) as e:
        select((9, 0), "sm100")
    assert str(e.value) == ("kernel 'sm100' (requested by the kernel argument) needs compute capability "
                            "10.0 or 10.3 (B200, B300); this device has 9.0")
    with pytest.raises(ValueError) as e:
        select((8, 6), "sm90")
    assert str(e.value) == ("kernel 'sm90' (requested by the kernel argument) needs compute capability 9.0 "
                            "(H100, H200); this device has 8.6")
    with pytest.raises(ValueError) as e:
        select((10, 0), "sm100", built=("sm90",))
    assert str(e.value) == ("kernel 'sm100' (requested by the kernel argument) is not in this build for "
                            "compute capability 10.0 (no sm_100a SM100 kernel compiled in)")
    with pytest.raises(ValueError, match="is not in this build \\(compiled without sm_90a\\)"):
        select((9, 0), "sm90", built=())


def test_environment_variable_precedence():
    # env applies when the argument is auto; an explicit argument wins; env "auto" or "" is auto.
    assert select((9, 0), env="portable")["kernel"] == "portable"
    assert select((9, 0), "sm90", env="portable")["kernel"] == "sm90"
    assert select((8, 6), "portable", env="sm90")["kernel"] == "portable"
    assert select((9, 0), env="auto")["kernel"] == "sm90"
    assert select((9, 0), env="")["kernel"] == "sm90"
    with pytest.raises(ValueError) as e:
        select((9, 0), env="sm100")
    assert "(requested by JAX_MLA_KERNEL)" in str(e.value) and "this device has 9.0" in str(e.value)
    with pytest.raises(ValueError) as e:
        select((9, 0), env="SM90")
    assert str(e.value) == f"JAX_MLA_KERNEL must be one of {CHOICES} (or unset), got 'SM90'"
    # A bad env value does not matter when the argument is explicit.
    assert select((9, 0), "portable", env="bogus")["kernel"] == "portable"


def test_old_gpus_and_bad_attributes_are_errors():
    for cc in ((7, 5), (7, 0), (6, 1)):
        for kernel in NAMES:
            with pytest.raises(ValueError) as e:
                select(cc, kernel)
            assert str(e.value) == (f"no CUDA kernel for compute capability {cc[0]}.{cc[1]}: jax_mla's GPU "
                                    "kernels need 8.0 or newer")
    for attr in (-1, 4, 99):
        with pytest.raises(ValueError) as e:
            select((9, 0), attr)
        assert str(e.value) == f"kernel must be one of {CHOICES} (attribute values 0 to 3), got {attr}"


# ----------------------------------------------------------------------------------------------
# Every combination against the rules, restated independently
# ----------------------------------------------------------------------------------------------

def expected(cc, attr, env, check, built, mode):
    """(kernel, fell_back, needs_self_check) or ('error', words) per README / kernel_select.h."""
    if attr not in range(4):
        return "error", "attribute values 0 to 3"
    req, source = NAMES[attr], "the kernel argument"
    if req == "auto" and env:
        if env not in NAMES:
            return "error", "JAX_MLA_KERNEL must be one of"
        req, source = env, "JAX_MLA_KERNEL"
    if cc[0] < 8:
        return "error", "need 8.0 or newer"
    if req == "sm90":
        if cc != (9, 0):
            return "error", f"requested by {source}) needs compute capability 9.0"
        return ("sm90", False, False) if "sm90" in built else ("error", "compiled without sm_90a")
    if req == "sm100":
        if cc not in ((10, 0), (10, 3)):
            return "error", f"requested by {source}) needs compute capability 10.0 or 10.3"
        need = "sm100" if cc == (10, 0) else "sm103"
        return ("sm100", False, False) if need in built else ("error", "is not in this build")
    if req == "portable":
        return "portable", False, False
    if cc == (9, 0) and "sm90" in built:
        cand, checked = "sm90", mode != ""
    elif (cc == (10, 0) and "sm100" in built) or (cc == (10, 3) and "sm103" in built):
        cand, checked = "sm100", True
    else:
        cand, checked = "portable", False
    if not checked:
        return cand, False, False
    return {"not run": (None, False, True), "passed": (cand, False, False),
            "failed": ("portable", True, False)}[check]


CCS = [(7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (9, 1), (10, 0), (10, 1), (10, 3), (11, 0), (12, 0), (12, 1)]
ENVS = [None, "", "auto", "sm90", "sm100", "portable", "bogus"]
BUILDS = [tuple(b for b, on in zip(("sm90", "sm100", "sm103"), bits) if on)
          for bits in itertools.product((0, 1), repeat=3)]


def test_every_combination():
    n = 0
    for cc, attr, env, check, built, mode in itertools.product(
            CCS, range(-1, 5), ENVS, ("not run", "passed", "failed"), BUILDS, ("", "force", "fault", "hang")):
        want = expected(cc, attr, env, check, built, mode)
        where = (cc, attr, env, check, built, mode)
        if want[0] == "error":
            with pytest.raises(ValueError) as e:
                select(cc, attr, env, check, built, mode)
            assert want[1] in str(e.value), (where, str(e.value))
        else:
            got = select(cc, attr, env, check, built, mode)
            assert (got["kernel"], got["fell_back"], got["needs_self_check"]) == want, where
        n += 1
    assert n == len(CCS) * 6 * len(ENVS) * 3 * len(BUILDS) * 4


# ----------------------------------------------------------------------------------------------
# FP8 caches: only kernels that read the format (kernel_select.h kReadsFp8Cache)
# ----------------------------------------------------------------------------------------------

FP8_READERS = set(_ext.FP8_KERNELS)


def expected_fp8(cc, attr, env, check, built, mode):
    """The rules for a call whose kv_cache holds FP8 rows: an explicit request (argument or env) for
    a kernel that does not read them is an error (after the attribute, env and 8.0 checks); auto
    keeps its candidate if that reads them, else takes the portable kernel if that does."""
    plain = expected(cc, attr, env, check, built, mode)
    if plain[0] == "error" and ("attribute" in plain[1] or "JAX_MLA_KERNEL must" in plain[1] or
                                "8.0 or newer" in plain[1]):
        return plain
    req = NAMES[attr]
    if req == "auto" and env and env != "auto":
        req = env
    if req != "auto":
        if req not in FP8_READERS:
            return "error", "does not read the FP8 kv_cache"
        return plain
    cand = _ext.testing.auto_candidate(cc[0], cc[1], built=list(built), self_check_mode=mode)[0]
    if cand in FP8_READERS:
        return plain
    if "portable" in FP8_READERS:
        return "portable", False, False
    return "error", "has no kernel for the FP8 kv_cache"


def test_fp8_messages():
    if "sm90" not in FP8_READERS:
        with pytest.raises(ValueError) as e:
            select((9, 0), "sm90", fp8=True)
        assert str(e.value).startswith("kernel 'sm90' (requested by the kernel argument) does not read the FP8 "
                                       "kv_cache (uint8 rows of 656 bytes); ")
        with pytest.raises(ValueError, match=r"kernel 'sm90' \(requested by JAX_MLA_KERNEL\) does not read"):
            select((9, 0), env="sm90", fp8=True)
    if not FP8_READERS:
        with pytest.raises(ValueError) as e:
            select((8, 6), fp8=True)
        assert str(e.value) == ("kernel 'auto' has no kernel for the FP8 kv_cache (uint8 rows of 656 bytes) on "
                                "compute capability 8.6: no CUDA kernel reads it yet (the CPU does)")
    else:
        assert select((9, 0), fp8=True)["kernel"] in FP8_READERS
    # The 16-bit cache is unaffected.
    assert select((9, 0))["kernel"] == "sm90"


def test_auto_on_sm100_takes_it_for_fp8_only_after_the_self_check():
    """SM100 never ran on hardware: auto takes it for an FP8 cache, as for a 16-bit one, only after its
    self-check passed (which runs every case over the FP8 cache too: runtime/self_check_cases.h)."""
    if "sm100" not in FP8_READERS:
        pytest.skip("the SM100 kernel does not read the FP8 cache in this build")
    built = ("sm90", "sm100", "sm103")
    for cc in ((10, 0), (10, 3)):
        assert select(cc, built=built, fp8=True) == dict(kernel=None, fell_back=False, needs_self_check=True)
        assert select(cc, built=built, self_check="passed", fp8=True)["kernel"] == "sm100"
        assert select(cc, built=built, self_check="failed", fp8=True) == dict(kernel="portable", fell_back=True,
                                                                              needs_self_check=False)
        assert select(cc, "sm100", built=built, fp8=True)["kernel"] == "sm100"  # explicit: no self-check


def test_sparse_decode_kernel():
    """mla_decode_sparse takes, for an FP8 cache, the kernel auto picks for a dense decode of that
    format where that kernel gathers one-token pages (SM90, SM100: after its self-check, as for
    mla_decode), else portable; for a 16-bit cache always portable."""
    def sparse(cc, env=None, self_check="not run", built=("sm90", "sm100", "sm103"), mode="", fp8=True):
        return _ext.testing.select_kernel(cc[0], cc[1], 0, env=env, self_check=self_check, built=list(built),
                                          self_check_mode=mode, fp8_cache=fp8, sparse=True)["kernel"]

    assert sparse((9, 0)) == "sm90"
    assert sparse((9, 0), fp8=False) == "portable"
    assert sparse((9, 0), env="portable") == "portable"
    assert sparse((9, 0), built=()) == "portable"
    assert sparse((9, 0), mode="force") is None  # the self-check first, as for mla_decode
    assert sparse((9, 0), mode="force", self_check="passed") == "sm90"
    for cc in ((10, 0), (10, 3)):
        assert sparse(cc) is None
        assert sparse(cc, self_check="passed") == "sm100"
        assert sparse(cc, self_check="passed", fp8=False) == "portable"
        assert sparse(cc, self_check="failed") == "portable"
        assert sparse(cc, env="sm100") == "sm100"  # JAX_MLA_KERNEL: no self-check, as for mla_decode
    assert sparse((8, 0)) == "portable"
    assert sparse((12, 0)) == "portable"
    # The dense choice is unchanged by the flag's default.
    assert select((10, 0), built=("sm100",), self_check="passed", fp8=True)["kernel"] == "sm100"


def test_fp8_every_combination():
    for cc, attr, env, check, built, mode in itertools.product(
            CCS, range(-1, 5), ENVS, ("not run", "passed", "failed"), BUILDS, ("", "force")):
        want = expected_fp8(cc, attr, env, check, built, mode)
        where = (cc, attr, env, check, built, mode)
        if want[0] == "error":
            with pytest.raises(ValueError) as e:
                select(cc, attr, env, check, built, mode, fp8=True)
            assert want[1] in str(e.value), (where, str(e.value))
        else:
            got = select(cc, attr, env, check, built, mode, fp8=True)
            assert (got["kernel"], got["fell_back"], got["needs_self_check"]) == want, where


# ----------------------------------------------------------------------------------------------
# The kernel argument in Python
# ----------------------------------------------------------------------------------------------

DATA = cases.make(cases.Case(lens=(0, 70, 3), s_q=2, h_q=3, page_size=16, causal=True, seed=8801))


def decode(*args, kernel="auto", **kw):
    return jax_mla.mla_decode(*args, causal=True, return_lse=True, kernel=kernel, **kw)


@pytest.mark.parametrize("bad, exc, message", [
    ("sm80", ValueError, f"mla_decode: kernel must be one of {CHOICES}, got 'sm80'"),
    ("Portable", ValueError, f"mla_decode: kernel must be one of {CHOICES}, got 'Portable'"),
    (3, TypeError, f"mla_decode: kernel must be a str, one of {CHOICES}, got int"),
    (None, TypeError, f"mla_decode: kernel must be a str, one of {CHOICES}, got NoneType"),
])
def test_kernel_argument_validation(bad, exc, message):
    with pytest.raises(exc) as e:
        decode(*DATA.args, kernel=bad)
    assert str(e.value) == message
    with pytest.raises(exc):  # at trace time under jit too
        jax.jit(lambda *a: decode(*a, kernel=bad)).trace(*DATA.args)


def test_python_and_handler_messages_agree():
    # The handlers refuse an attribute outside 0..3 with the same list of choices (test_ext_smoke).
    with pytest.raises(ValueError) as py:
        decode(*DATA.args, kernel="x")
    with pytest.raises(ValueError) as cc:
        _ext.testing.select_kernel(9, 0, 7)
    prefix = f"kernel must be one of {CHOICES}"
    assert prefix in str(py.value) and str(cc.value).startswith(prefix)


def test_kernel_is_ignored_on_the_cpu():
    want = [np.asarray(x) for x in decode(*DATA.args)]
    for kernel in NAMES:
        got = [np.asarray(x) for x in jax.jit(lambda *a, k=kernel: decode(*a, kernel=k))(*DATA.args)]
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    cases.assert_close_rounding_only(*want, *cases.reference(DATA), DATA.case.dtype, cases.max_abs_score(DATA))


def test_kernel_info_on_the_cpu():
    info = jax_mla.kernel_info(jax.devices("cpu")[0])
    assert info["platform"] == "cpu" and info["kernel"] == "cpu"
    assert info["built"] == list(_ext.built_kernels())
    if _ext.has_cuda():
        assert "portable" in info["built"]
    else:
        assert info["built"] == []
