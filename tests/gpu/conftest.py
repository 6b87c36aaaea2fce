"""tests/gpu: test_gpu.py checks device schedules with the split-plan checks of
tests/cpu/test_split_plan.py, so that folder is importable from here too (pytest puts only a test
file's own folder on sys.path)."""

from __future__ import annotations

import os
import sys

CPU_TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cpu")
if CPU_TESTS not in sys.path:
    sys.path.append(CPU_TESTS)
