"""benchmarks/build_wheels.sh: a malformed spec or an unknown commit stops it before any build."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "build_wheels.sh")


def _run(*specs):
    # NO_DIST=0 would build the working tree's wheel first: the check must come before it, so a
    # mistake costs nothing. PY points nowhere: reaching a build would fail differently.
    env = dict(os.environ, PY="/nonexistent/python", NO_DIST="0")
    return subprocess.run(["bash", SCRIPT, *specs], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)


@pytest.mark.skipif(shutil.which("git") is None or not os.path.isdir(os.path.join(ROOT, ".git")),
                    reason="needs the git checkout")
@pytest.mark.parametrize("spec,message", [
    ("noequals", "expected NAME=REV"),
    ("=HEAD", "expected NAME=REV"),
    ("name=", "expected NAME=REV"),
    ("exp=0000000000000000000000000000000000000bad", "no commit"),
    ("exp=HEAD+0000000000000000000000000000000000000bad", "no commit"),
])
def test_bad_specs_stop_before_any_build(spec, message):
    proc = _run(spec)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr
    assert "built" not in proc.stdout
