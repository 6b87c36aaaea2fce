"""benchmarks/default_bits.py (bits of the default plans, saved per build and compared): compare
reports equal and differing files; save runs (on a few cases) and its files compare equal."""

from __future__ import annotations

import numpy as np
import pytest

import cases
from script_loader import load_script

pytestmark = pytest.mark.usefixtures("on_cpu")


def test_compare(tmp_path):
    m = load_script("benchmarks/default_bits.py")
    a, b, c = (str(tmp_path / f"{n}.npz") for n in "abc")
    np.savez(a, x=np.arange(4), y=np.zeros(2))
    np.savez(b, x=np.arange(4), y=np.zeros(2))
    np.savez(c, x=np.arange(4), y=np.ones(2))
    assert m.compare(a, b) == 0
    assert m.compare(a, c) == 1


def test_save_twice_is_equal(tmp_path, monkeypatch):
    m = load_script("benchmarks/default_bits.py")
    few = [cases.Case(lens=(0, 70, 3000), h_q=16, seed=1), cases.Case(lens=(1,), s_q=2, h_q=3, causal=True, seed=2)]
    monkeypatch.setattr(cases, "edge_cases", lambda pages: few)
    monkeypatch.setattr(cases, "random_sweep", lambda *a, **k: [])
    a, b = str(tmp_path / "a.npz"), str(tmp_path / "b.npz")
    m.save(a, "auto")
    m.save(b, "auto")
    assert m.compare(a, b) == 0
    assert len(np.load(a).files) == 2 * (3 * 2 + 2)  # per case: 3 x (out, lse) + 2 schedules
