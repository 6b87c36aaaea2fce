"""README.md's marked code blocks run, so they cannot rot.

A block is tested when the line before its ```python fence is `<!-- snippet: NAME -->`. The
snippets run in README order in a subprocess with 8 CPU devices (the sharding snippets need
several), each with fresh globals and the same working directory (a later snippet may read a file
an earlier one wrote); `<!-- snippet: NAME (new process) -->` starts a new subprocess first.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from script_loader import ROOT

MARKED = re.compile(r"^<!-- snippet: ([\w.-]+)( \(new process\))? -->\n```python\n(.*?)^```$",
                    re.M | re.S)
# Every snippet this test must find (a renamed or dropped marker fails here, not silently).
EXPECTED = ["update-kv-cache", "sharding", "sharding-shard-map", "export", "export-load"]

RUNNER = r"""
import sys, traceback
failed = 0
for path in sys.argv[1:]:
    name = path.rsplit("/", 1)[-1][:-3]
    try:
        with open(path) as f:
            code = compile(f.read(), f"README snippet {name}", "exec")
        exec(code, {"__name__": "__main__"})
        print(f"snippet {name}: ok", flush=True)
    except Exception:
        failed += 1
        print(f"snippet {name}: FAILED\n{traceback.format_exc()}", flush=True)
sys.exit(1 if failed else 0)
"""


def snippets():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    return [(m.group(1), bool(m.group(2)), m.group(3)) for m in MARKED.finditer(text)]


def test_readme_has_the_marked_snippets():
    names = [name for name, _, _ in snippets()]
    assert len(names) == len(set(names)), f"duplicate snippet names: {names}"
    missing = [n for n in EXPECTED if n not in names]
    assert not missing, f"README.md lost the snippets {missing} (found {names})"


def test_readme_snippets_run(tmp_path, cpu_devices_env):
    found = snippets()
    if not found:
        pytest.fail("no marked snippets in README.md")
    groups: list[list[str]] = []
    for i, (name, new_process, code) in enumerate(found):
        path = tmp_path / f"{i:02d}_{name}.py"
        path.write_text(code)
        if new_process or not groups:
            groups.append([])
        groups[-1].append(str(path))
    env = cpu_devices_env(8)
    for group in groups:
        # -P and the temporary working directory: the installed jax_mla, not the checkout.
        proc = subprocess.run([sys.executable, "-P", "-c", RUNNER, *group], cwd=str(tmp_path),
                              env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr[-4000:]}"
        assert proc.stdout.count(": ok") == len(group), proc.stdout
