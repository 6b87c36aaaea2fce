"""Loads a repository script that is not part of the package (benchmarks/, examples/) as a module."""

from __future__ import annotations

import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_script(relpath: str):
    """The module of ROOT/relpath, registered in sys.modules under its file name (dataclasses and
    pickling look a module up there)."""
    name = os.path.splitext(os.path.basename(relpath))[0]
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, relpath))
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
