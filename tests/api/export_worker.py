"""Runs serialized jax.export artifacts in a fresh process (used by tests/api/test_export.py).

    python3 -P tests/api/export_worker.py DIR

DIR holds inputs.pkl (the list of the call's NumPy arguments) and for each artifact NAME a
NAME.bin (Exported.serialize()) and NAME.pkl (the list of the exporting process's results).
The script first checks that calling an artifact before `import jax_mla` fails (its custom-call
targets are not registered yet), then imports jax_mla, runs every artifact on the default device
(the CPU when JAX_PLATFORMS=cpu, the GPU for an artifact exported for CUDA alone) and compares the
results with the exporter's bit for bit. Prints one "NAME: ok" line per artifact.
"""

from __future__ import annotations

import glob
import os
import pickle
import sys

import jax
import numpy as np


def main(folder: str) -> int:
    with open(os.path.join(folder, "inputs.pkl"), "rb") as f:
        args = pickle.load(f)
    names = sorted(os.path.basename(p)[:-4] for p in glob.glob(os.path.join(folder, "*.bin")))
    assert names, f"no artifacts in {folder}"
    exported = {}
    for name in names:
        with open(os.path.join(folder, name + ".bin"), "rb") as f:
            exported[name] = jax.export.deserialize(bytearray(f.read()))

    assert "jax_mla" not in sys.modules
    try:
        jax.block_until_ready(exported[names[0]].call(*args))
    except Exception as e:  # noqa: BLE001 - the exact type depends on the jaxlib version
        assert "jax_mla_decode" in str(e) or "custom call" in str(e).lower(), str(e)
        print(f"before import jax_mla: refused ({type(e).__name__})")
    else:
        raise AssertionError("an artifact with jax_mla custom calls ran before import jax_mla")

    import jax_mla  # noqa: F401  registers the FFI targets

    for name in names:
        got = exported[name].call(*args)
        with open(os.path.join(folder, name + ".pkl"), "rb") as f:
            want = pickle.load(f)
        got = jax.tree_util.tree_leaves(got)
        assert len(got) == len(want), (name, len(got), len(want))
        for i, (g, w) in enumerate(zip(got, want)):
            g = np.asarray(g)
            assert g.shape == w.shape and g.dtype == w.dtype, (name, i, g.shape, w.shape)
            np.testing.assert_array_equal(g.view(np.uint8), w.view(np.uint8),
                                          err_msg=f"{name}: result {i} differs")
        print(f"{name}: ok (platforms {exported[name].platforms})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
