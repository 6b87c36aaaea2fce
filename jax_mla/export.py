"""jax.export support.

jax.export refuses to serialize a function that contains custom calls it does not know, since
the exported artifact is only usable where the same FFI targets are registered. jax_mla's two
targets are registered by `import jax_mla`, so a module exported with them runs wherever the same
(or an ABI-compatible) jax_mla is installed and imported before deserializing:

    import jax, jax_mla
    exp = jax.export.export(jax.jit(step), disabled_checks=jax_mla.export_disabled_checks())(*args)
    blob = exp.serialize()                       # needs the `flatbuffers` package
    ...
    import jax_mla                               # registers the targets in the consuming process
    out = jax.export.deserialize(blob).call(*args)

The targets' operands, results and attributes (docs/design.md, "FFI targets") are the
compatibility contract of such artifacts.
"""

from __future__ import annotations

import jax.export

from ._lowering import TARGETS


def export_disabled_checks() -> list[jax.export.DisabledSafetyCheck]:
    """The `disabled_checks` list that lets jax.export.export accept jax_mla's custom calls.

    One DisabledSafetyCheck.custom_call per FFI target of jax_mla ("jax_mla_decode",
    "jax_mla_decode_schedule"); concatenate it with your own list if you need other checks off.
    """
    return [jax.export.DisabledSafetyCheck.custom_call(name) for name in TARGETS]
