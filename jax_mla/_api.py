"""Public entry points: mla_decode and decode_schedule."""

from __future__ import annotations

import functools
from typing import Any

import jax.numpy as jnp
import numpy as np

from . import _lowering, _sharding, _validate  # noqa: F401 (_lowering registers the FFI targets)
from ._extension import ext
from ._primitive import mla_decode_p, mla_decode_schedule_p

_FALLBACK_NUM_SMS = 132  # H100/H200 SM count, used when no CUDA device is visible


@functools.lru_cache(maxsize=None)
def _num_sms() -> int:
    n = int(ext.cuda_sm_count())
    return n if n > 0 else _FALLBACK_NUM_SMS


def default_num_parts(seq_q: int, num_heads: int) -> int:
    """Default number of split-KV parts: one CTA per SM.

    A request's s_q * num_heads query rows take ceil(s_q * num_heads / 64) CTAs (row blocks), so
    max(1, num_sms // that) parts fill the GPU. num_sms is the SM count of the first CUDA
    device, or 132 when none is visible (also on CPU, so CPU and GPU plans agree).
    """
    m_blocks = -(-(seq_q * num_heads) // _validate.BLOCK_M)
    return max(1, _num_sms() // m_blocks)


def _as_array(x: Any) -> Any:
    """Leaves JAX/NumPy arrays and tracers alone; turns other inputs into NumPy arrays (no cast)."""
    return x if hasattr(x, "shape") and hasattr(x, "dtype") else np.asarray(x)


def mla_decode(q, kv_cache, block_table, seq_lens, *, softmax_scale=None, causal=False,
               return_lse=False, schedule=None, kernel="auto", batch_invariant=False,
               invariant_chunk=None):
    """Multi-head latent attention decode over a paged latent KV cache.

    Args:
      q: (b, s_q, h_q, 576) bfloat16 or float16; 1 <= s_q <= 8, 1 <= h_q <= 128. The 576 columns
        are the absorbed query (512 latent + 64 RoPE).
      kv_cache: (num_pages, page_size, 576) or (num_pages, page_size, 1, 576), q's dtype. Keys
        are the whole 576-wide rows, values their first 512 columns. Or the FP8 cache: uint8
        (num_pages, page_size, 656) or (num_pages, page_size, 1, 656), one pack_fp8_kv row per
        token; the result is then the decode over unpack_fp8_kv(kv_cache) (README, "FP8 cache":
        which kernels read it, and the error bound).
      block_table: (b, max_pages) int32; page i of request r is kv_cache[block_table[r, i]].
        Only the first ceil(seq_lens[r] / page_size) entries of a row are read.
      seq_lens: (b,) int32, 0 <= seq_lens[r] <= max_pages * page_size: cached tokens per request,
        including the s_q new ones.
      softmax_scale: static Python/NumPy number multiplying q . k; default 576 ** -0.5.
      causal: query token t (0-based) sits at position seq_len - s_q + t and sees only positions
        up to it. Without causal every query token sees all seq_len keys.
      return_lse: also return the log-sum-exp of the scaled scores.
      schedule: optional split-KV schedule from decode_schedule(seq_lens, ...) for the same
        seq_lens, to share one plan across layers; computed inside the op when None.
      kernel: static str, which CUDA kernel runs the call: "auto" (default), "sm90", "sm100" or
        "portable". "auto" honours the environment variable JAX_MLA_KERNEL (same values) and
        otherwise picks by compute capability: sm90 on 9.0, sm100 on 10.0 / 10.3 once it passed a
        one-time self-check against the portable kernel (else portable, with a warning), portable
        on any other GPU of compute capability >= 8.0. Asking for a kernel the GPU (or the build)
        cannot run fails the call with an error naming both. Validated, then ignored, on the CPU.
        kernel_info() says what "auto" picks on a device.
      batch_invariant: static bool. True: a request's out and lse are bit-identical whatever else
        is in the batch (its size, the other requests, its position), on the same kernel and
        static arguments: each request is cut into fixed chunks of invariant_chunk tokens (at
        most num_parts of them; a longer request gets num_parts equal longer chunks), each chunk
        computed on its own and the chunks merged in a fixed order. It costs speed where the
        default plan would have cut requests differently (README, "Batch-invariant decode") and,
        on the GPU, a workspace of up to b * num_parts partial results. A passed schedule must
        come from decode_schedule(..., batch_invariant=True) with the same invariant_chunk.
      invariant_chunk: static int, tokens per chunk with batch_invariant=True: a multiple of 64,
        default 1024. Requests keep their bits only between calls with the same chunk.

    Returns:
      out (b, s_q, h_q, 512) in q's dtype, and with return_lse also lse (b, s_q, h_q) float32
      (natural log). Rows with no visible key (seq_len == 0, or causal and seq_len < s_q) get
      out = 0 and lse = -inf.

    Sharding: under jit (or eagerly on sharded arrays) the op runs as one kernel call per
    device, with no collective, for these layouts:
      - batch (data parallel): q, block_table and seq_lens split on axis 0; kv_cache either
        replicated or split on its page axis over the same mesh axes, shard i then holding pages
        [i * P / n, (i + 1) * P / n). Page ids stay global: a request may only read its shard's
        pages (else the call fails like an invalid page id). A passed schedule is not used, each
        shard plans its own requests inside the op.
      - heads (tensor parallel): q split on axis 2, the other operands replicated; a passed
        schedule is used by every shard.
    Other layouts are resharded first (results never depend on the sharding). Over Explicit
    mesh axes the shardings are read at trace time and the call becomes a shard_map (exportable);
    over Auto axes (jit in_shardings, shardings propagated from other ops) XLA applies the op's
    custom_partitioning rule when compiling, which jax.export cannot serialize: a multi-device
    export of such a call fails (ValueError) and names the exportable ways. Inside a
    jax.shard_map, mla_decode sees each shard's arrays (ids local to its pages).
    """
    q, kv_cache, block_table, seq_lens = map(_as_array, (q, kv_cache, block_table, seq_lens))
    dims = _validate.check_decode_operands(q, kv_cache, block_table, seq_lens)
    scale = _validate.check_softmax_scale(
        _validate.HEAD_DIM_QK ** -0.5 if softmax_scale is None else softmax_scale)
    causal = _validate.check_bool("causal", causal)
    return_lse = _validate.check_bool("return_lse", return_lse)
    kernel = _validate.check_kernel(kernel)
    chunk_blocks = _validate.check_batch_invariant(batch_invariant, invariant_chunk)
    given_parts = None
    if schedule is not None:
        schedule = _as_array(schedule)
        given_parts = _validate.schedule_num_parts(schedule, dims.batch, invariant=chunk_blocks > 0)
    _validate.check_concrete_seq_lens(seq_lens, block_table, dims)

    def call(q, kv_cache, block_table, seq_lens, schedule):
        # One kernel call on (per-shard) arrays; dims may be a shard's, not the global ones.
        if kv_cache.ndim == 4:
            kv_cache = kv_cache.reshape(kv_cache.shape[0], kv_cache.shape[1], kv_cache.shape[3])
        if schedule is None:
            num_parts = given_parts or default_num_parts(q.shape[1], q.shape[2])
            schedule = jnp.zeros((0,), jnp.int32)
        else:
            num_parts = given_parts
        return mla_decode_p.bind(q, kv_cache, block_table, seq_lens, schedule,
                                 softmax_scale=scale, causal=causal, num_parts=num_parts,
                                 kernel=kernel, chunk_blocks=chunk_blocks)

    plan = _sharding.plan(q, kv_cache, block_table, seq_lens)
    args = [jnp.asarray(x) for x in (q, kv_cache, block_table, seq_lens)]
    sched = None if schedule is None else jnp.asarray(schedule)
    if plan is None:
        out, lse = call(*args, sched)
    else:
        _sharding.check_concrete_placement(plan, block_table, seq_lens, dims.num_pages,
                                           dims.page_size)
        out, lse = _sharding.sharded_call(plan, call, *args, sched)
    return (out, lse) if return_lse else out


def decode_schedule(seq_lens, *, num_heads, seq_q=1, num_parts=None, batch_invariant=False,
                    invariant_chunk=None):
    """Split-KV schedule for one decode step, to pass as mla_decode(..., schedule=...).

    All layers of a step share seq_lens, so computing the plan once and passing it to every
    layer's mla_decode saves the per-call scheduling work. The schedule is an int32 array of
    shape (num_parts * 8 + 2 * b + 3,) (format: cuda/common/scheduler.h: per part its range of
    (request, KV block), per request its partial-result slots, and the list of requests the
    combine step merges); it only decides how work is split, never the result (up to float
    rounding). The batch is cut along a "line" of parts or into equal "pieces" per request,
    whichever the scheduler's cost model finds cheaper (README, "Split-KV schedule"); on CPU,
    mla_decode rejects a schedule that is not the plan for its seq_lens and num_parts.

    Args:
      seq_lens: (b,) int32, the same array later passed to mla_decode.
      num_heads: h_q of the mla_decode calls that will use it.
      seq_q: s_q of those calls.
      num_parts: static number of parts; default max(1, num_sms // ceil(seq_q * num_heads / 64)).
      batch_invariant, invariant_chunk: as mla_decode's, which must get the same values: the
        batch-invariant plan (whole chunks per part), whose array is 4 elements longer.
    """
    seq_lens = _as_array(seq_lens)
    chunk_blocks = _validate.check_batch_invariant(batch_invariant, invariant_chunk, "decode_schedule")
    b = _validate.check_seq_lens_only(seq_lens)
    _validate.check_concrete_seq_lens_nonnegative(seq_lens)
    num_heads = _validate.check_int_in_range("num_heads", num_heads, 1, _validate.MAX_HEADS_Q,
                                             "decode_schedule")
    seq_q = _validate.check_int_in_range("seq_q", seq_q, 1, _validate.MAX_SEQ_Q, "decode_schedule")
    if num_parts is None:
        num_parts = default_num_parts(seq_q, num_heads)
    num_parts = _validate.check_num_parts(num_parts, b)
    return mla_decode_schedule_p.bind(jnp.asarray(seq_lens), num_parts=num_parts, chunk_blocks=chunk_blocks)


def kernel_info(device=None) -> dict:
    """Which decode kernel mla_decode(..., kernel="auto") runs on a device.

    Args:
      device: a jax Device; default jax.devices()[0].

    Returns a dict. For a CUDA device (its first call here initializes it for jax_mla exactly as
    the first mla_decode would, running the self-check where the automatic choice needs one):
      platform "cuda", device (str), compute_capability (major, minor), kernel ("sm90", "sm100" or
      "portable": what "auto" picks, after JAX_MLA_KERNEL and the self-check), fp8_kernel (what "auto"
      runs for an FP8 kv_cache, "" when no kernel there reads it), fell_back (auto took
      portable because the candidate failed its self-check), self_check ("not run", "passed",
      "failed"), self_check_kernel (the kernel checked, "" if none), self_check_detail (why it
      failed), env_kernel / env_self_check (JAX_MLA_KERNEL / JAX_MLA_SELFCHECK as this process read
      them; both are read once, at the first GPU initialization), built (the GPU kernels in this build).
    For a CPU device: platform "cpu", device, kernel "cpu", built.
    Raises RuntimeError when jax_mla cannot run on that GPU (compute capability below 8.0, an
    invalid JAX_MLA_KERNEL or JAX_MLA_SELFCHECK, or a build without CUDA).
    """
    import jax

    device = jax.devices()[0] if device is None else device
    built = list(ext.built_kernels())
    if device.platform == "cpu":
        return dict(platform="cpu", device=str(device), kernel="cpu", built=built)
    if device.platform not in ("gpu", "cuda"):
        raise RuntimeError(f"kernel_info: jax_mla has no kernel for platform {device.platform!r}")
    ordinal = getattr(device, "local_hardware_id", None)
    info = dict(ext.kernel_info(int(device.id if ordinal is None else ordinal)))
    return dict(platform="cuda", device=str(device), built=built, **info)
