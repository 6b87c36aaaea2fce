"""jax-mla: multi-head latent attention (MLA) decode for JAX, as XLA FFI custom calls.

Public API:
  mla_decode(q, kv_cache, block_table, seq_lens, *, softmax_scale=None, causal=False,
             return_lse=False, schedule=None, kernel="auto")
  mla_decode_sparse(q, kv_cache, indices, *, topk_length=None, softmax_scale=None,
                    attn_sink=None, return_lse=False)
                             sparse (top-k selected slots) decode, DeepSeek-V3.2
  decode_schedule(seq_lens, *, num_heads, seq_q=1, num_parts=None)
  update_kv_cache(kv_cache, new_latent, block_table, positions)
                             write new tokens' latent rows into the paged cache (in place if donated)
  pack_fp8_kv(rows) / unpack_fp8_kv(packed, dtype=jnp.float32)
                             576-value rows <-> 656-byte FP8 rows (FlashMLA's DeepSeek-V3.2 layout)
  export_disabled_checks()   jax.export DisabledSafetyCheck list for jax_mla's custom calls
  kernel_info(device=None)   which CUDA kernel mla_decode(kernel="auto") runs on a device
  reference                  module with mla_decode_reference, mla_decode_sparse_reference (plain jax.numpy)
"""

from importlib import metadata as _metadata

from . import reference
from ._api import decode_schedule, kernel_info, mla_decode
from ._cache import update_kv_cache
from ._fp8 import pack_fp8_kv, unpack_fp8_kv
from ._sparse import mla_decode_sparse
from .export import export_disabled_checks

try:
    __version__ = _metadata.version("jax-mla")
except _metadata.PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0+unknown"

__all__ = ["mla_decode", "mla_decode_sparse", "decode_schedule", "update_kv_cache", "pack_fp8_kv", "unpack_fp8_kv",
           "export_disabled_checks", "kernel_info", "reference", "__version__"]
