"""Every argument check of jax_mla, in one place.

Used by the public API (jax_mla._api) before anything is traced, and by the primitives' abstract
evaluation rules (jax_mla._primitive), so that a check can never be skipped by binding the
primitive directly and the API and the primitive always say the same thing.

Conventions: a wrong dtype or a wrong Python type raises TypeError, a wrong shape or value raises
ValueError, and every message names the function, the argument, what was expected and what was
received. The shape/dtype checks only look at ``.shape`` and ``.dtype``, so they accept concrete
arrays, tracers and ShapedArrays alike.
"""

from __future__ import annotations

import numbers
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ._extension import FP8_KERNELS, KERNELS, LIMITS

# The limits of cuda/runtime/limits.h, as the extension exports them: the handlers check the same
# ones (tests/api/test_limits.py).
HEAD_DIM_QK = LIMITS["HEAD_DIM_QK"]
HEAD_DIM_V = LIMITS["HEAD_DIM_V"]
MAX_SEQ_Q = LIMITS["MAX_SEQ_Q"]
MAX_HEADS_Q = LIMITS["MAX_HEADS_Q"]
BLOCK_M = LIMITS["BLOCK_M"]  # query rows per CTA / CPU task
MIN_GPU_PAGE_SIZE = LIMITS["MIN_GPU_PAGE_SIZE"]  # the GPU kernels need a power-of-two page size
MAX_GPU_PAGE_SIZE = LIMITS["MAX_GPU_PAGE_SIZE"]  # in [MIN_GPU_PAGE_SIZE, MAX_GPU_PAGE_SIZE]
PART_FIELDS = LIMITS["PART_FIELDS"]  # int32 fields per part in the schedule (cuda/common/scheduler.h)
COMBINE_HEADER = LIMITS["COMBINE_HEADER"]  # int32 header of the schedule's combine list
MANY_SPLITS = LIMITS["MANY_SPLITS"]  # requests with more splits are listed first in the combine list
INVARIANT_FIELDS = LIMITS["INVARIANT_FIELDS"]  # trailer of a batch-invariant schedule
BLOCK_N = LIMITS["BLOCK_N"]  # KV tokens per scheduling block
DEFAULT_INVARIANT_CHUNK = LIMITS["DEFAULT_INVARIANT_CHUNK"]  # batch_invariant's chunk (tokens)
MAX_INVARIANT_CHUNK = LIMITS["MAX_INVARIANT_CHUNK"]
_INT32_MAX = LIMITS["INT32_MAX"]
MAX_GPU_BATCH = LIMITS["MAX_GPU_BATCH"]  # requests a GPU call plans in the op (sparse: b * s_q)
# The FP8 cache row (cuda/common/config.h; jax_mla._fp8 packs it): a uint8 kv_cache's last dimension,
# the latent values per float32 scale, and where the scales and the bfloat16 RoPE values start.
FP8_ROW_BYTES = LIMITS["FP8_ROW_BYTES"]
FP8_TILE_COLS = LIMITS["FP8_TILE_COLS"]
FP8_SCALES_OFFSET = LIMITS["FP8_SCALES_OFFSET"]
FP8_ROPE_OFFSET = LIMITS["FP8_ROPE_OFFSET"]
# KERNELS: values of jax_mla_decode's int32 attribute "kernel" (cuda/runtime/kernel_select.h).
_KERNEL_CHOICES = ", ".join(repr(k) for k in KERNELS)

_FLOAT_DTYPES = (np.dtype(jnp.bfloat16), np.dtype(np.float16))
_PACK_DTYPES = _FLOAT_DTYPES + (np.dtype(np.float32),)  # rows pack_fp8_kv quantizes
_INT32 = np.dtype(np.int32)
_UINT8 = np.dtype(np.uint8)  # a kv_cache of this dtype holds FP8 rows
_FP8_HINT = f"uint8 for FP8 rows of {FP8_ROW_BYTES} bytes from pack_fp8_kv"


class DecodeDims(NamedTuple):
    batch: int
    seq_q: int
    heads_q: int
    num_pages: int
    page_size: int
    max_pages: int
    kv_fp8: bool = False  # kv_cache holds FP8 rows (uint8, FP8_ROW_BYTES a token)


def schedule_size(batch: int, num_parts: int, invariant: bool = False) -> int:
    """Elements of a schedule for `batch` requests and `num_parts` parts (scheduler.h): the parts,
    split_offsets (b + 1), then the combine list (a 2-element header and b entries); a
    batch-invariant plan's has INVARIANT_FIELDS more, so that no num_parts gives the other kind's
    length."""
    extra = INVARIANT_FIELDS if invariant else 0
    return num_parts * PART_FIELDS + (batch + 1) + COMBINE_HEADER + batch + extra


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in np.shape(x)) if not hasattr(x, "shape") else tuple(x.shape)


def _dtype(x: Any) -> np.dtype:
    if hasattr(x, "dtype"):
        return np.dtype(x.dtype)
    # Python scalars / lists: what NumPy would make of them (no silent casting later).
    return np.asarray(x).dtype


def _dtype_name(dt: np.dtype) -> str:
    return np.dtype(dt).name


def _check_int32(x: Any, name: str, where: str, hint: bool = True) -> None:
    dt = _dtype(x)
    if dt != _INT32:
        advice = " (convert it explicitly, e.g. with .astype(jnp.int32))" if hint else ""
        raise TypeError(f"{where}: {name} must have dtype int32, got {_dtype_name(dt)}{advice}")


def _check_same_dtype(x: Any, name: str, dtype: np.dtype, other: str, where: str, hint: str = "") -> None:
    dt = _dtype(x)
    if dt != dtype:
        raise TypeError(f"{where}: {name} must have the same dtype as {other} ({_dtype_name(dtype)}), "
                        f"got {_dtype_name(dt)}{hint}")


def is_concrete(x: Any) -> bool:
    """True when x holds known values: a NumPy array or a JAX array that is not a tracer (under
    jit/vmap/grad) nor an abstract value (inside abstract evaluation)."""
    if isinstance(x, (np.ndarray, np.generic)):
        return True
    return isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)


# ----------------------------------------------------------------------------------------------
# Operands of mla_decode
# ----------------------------------------------------------------------------------------------


def is_fp8_cache(kv_cache: Any) -> bool:
    """The cache's dtype picks its format: uint8 means FP8 rows (jax_mla._fp8), else 576 values."""
    return _dtype(kv_cache) == _UINT8


def _check_kv_cache_shape(kv_cache: Any, where: str) -> tuple[int, int]:
    """(num_pages, page_size, row) or (num_pages, page_size, 1, row), row = 576 values or, for a
    uint8 cache, FP8_ROW_BYTES; returns (num_pages, page_size)."""
    kv_shape = _shape(kv_cache)
    fp8 = is_fp8_cache(kv_cache)
    row = FP8_ROW_BYTES if fp8 else HEAD_DIM_QK
    if len(kv_shape) == 4:
        if kv_shape[2] != 1:
            raise ValueError(
                f"{where}: a rank-4 kv_cache must have shape (num_pages, page_size, 1, {row}) "
                f"(one latent head), got shape {kv_shape}")
    elif len(kv_shape) != 3:
        raise ValueError(
            f"{where}: kv_cache must have shape (num_pages, page_size, {row}) or "
            f"(num_pages, page_size, 1, {row}), got shape {kv_shape}")
    if kv_shape[-1] != row:
        if fp8:
            raise ValueError(
                f"{where}: a uint8 kv_cache holds FP8 rows (pack_fp8_kv) and must have last "
                f"dimension {FP8_ROW_BYTES}, got shape {kv_shape}")
        hint = (f" (a cache of {FP8_ROW_BYTES}-byte FP8 rows must have dtype uint8)"
                if kv_shape[-1] == FP8_ROW_BYTES else "")
        raise ValueError(
            f"{where}: kv_cache must have last dimension {HEAD_DIM_QK}, got shape {kv_shape}{hint}")
    num_pages, page_size = kv_shape[0], kv_shape[1]
    if num_pages < 1:
        raise ValueError(f"{where}: kv_cache must have at least one page, got shape {kv_shape}")
    if page_size < 1:
        raise ValueError(f"{where}: kv_cache must have page_size >= 1 (dimension 1), got shape {kv_shape}")
    return num_pages, page_size


def _check_block_table(block_table: Any, b: int, b_source: str, where: str) -> tuple[int, ...]:
    """(b, max_pages) int32 with b taken from `b_source`; returns its shape."""
    bt_shape = _shape(block_table)
    if len(bt_shape) != 2 or bt_shape[0] != b:
        raise ValueError(
            f"{where}: block_table must have shape (b, max_pages) = ({b}, max_pages) with b from "
            f"{b_source}, got shape {bt_shape}")
    if bt_shape[1] < 1:
        raise ValueError(f"{where}: block_table must have at least one column, got shape {bt_shape}")
    _check_int32(block_table, "block_table", where)
    return bt_shape


def _check_q_and_kv_cache(q: Any, kv_cache: Any, where: str) -> tuple[int, int, int, int, int, bool]:
    """q (b, s_q, h_q, 576) bf16/fp16 within the limits and a kv_cache of q's dtype or FP8 rows:
    what mla_decode and mla_decode_sparse check first. Returns (b, s_q, h_q, num_pages, page_size,
    fp8)."""
    q_shape = _shape(q)
    if len(q_shape) != 4 or q_shape[-1] != HEAD_DIM_QK:
        raise ValueError(
            f"{where}: q must have shape (b, s_q, h_q, {HEAD_DIM_QK}) (rank 4, last dimension "
            f"{HEAD_DIM_QK}), got shape {q_shape}")
    b, s_q, h_q, _ = q_shape
    if b < 1:
        raise ValueError(f"{where}: q must have batch size b >= 1, got shape {q_shape}")
    if not 1 <= s_q <= MAX_SEQ_Q:
        raise ValueError(
            f"{where}: q must have 1 <= s_q <= {MAX_SEQ_Q} query tokens per request (dimension 1), "
            f"got s_q = {s_q} in shape {q_shape}")
    if not 1 <= h_q <= MAX_HEADS_Q:
        raise ValueError(
            f"{where}: q must have 1 <= h_q <= {MAX_HEADS_Q} query heads (dimension 2), "
            f"got h_q = {h_q} in shape {q_shape}")
    q_dtype = _dtype(q)
    if q_dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{where}: q must have dtype bfloat16 or float16, got {_dtype_name(q_dtype)}")

    num_pages, page_size = _check_kv_cache_shape(kv_cache, where)
    fp8 = is_fp8_cache(kv_cache)
    if not fp8:
        _check_same_dtype(kv_cache, "kv_cache", q_dtype, "q", where, hint=f" (or {_FP8_HINT})")
    return b, s_q, h_q, num_pages, page_size, fp8


def check_decode_operands(q: Any, kv_cache: Any, block_table: Any, seq_lens: Any,
                          where: str = "mla_decode") -> DecodeDims:
    """Checks ranks, dims and dtypes of the four array operands; returns the problem's dims.

    kv_cache may be (num_pages, page_size, 576) or (num_pages, page_size, 1, 576) of q's dtype, or
    the same with FP8_ROW_BYTES uint8 (FP8 rows) in place of the 576 values.
    """
    b, s_q, h_q, num_pages, page_size, fp8 = _check_q_and_kv_cache(q, kv_cache, where)

    bt_shape = _check_block_table(block_table, b, "q", where)

    sl_shape = _shape(seq_lens)
    if sl_shape != (b,):
        raise ValueError(
            f"{where}: seq_lens must have shape (b,) = ({b},) with b from q, got shape {sl_shape}")
    _check_int32(seq_lens, "seq_lens", where)

    return DecodeDims(b, s_q, h_q, num_pages, page_size, bt_shape[1], fp8)


def check_concrete_seq_lens(seq_lens: Any, block_table: Any, dims: DecodeDims,
                            where: str = "mla_decode") -> None:
    """Value checks done at call time when seq_lens (and block_table) are concrete.

    Under jit they are tracers and these checks move to the kernels (see docs/design.md,
    "Run-time errors").
    """
    if not is_concrete(seq_lens):
        return
    lens = np.asarray(seq_lens)
    capacity = dims.max_pages * dims.page_size
    bad = np.nonzero((lens < 0) | (lens > capacity))[0]
    if bad.size:
        r = int(bad[0])
        raise ValueError(
            f"{where}: seq_lens must satisfy 0 <= seq_lens[r] <= max_pages * page_size = "
            f"{dims.max_pages} * {dims.page_size} = {capacity} (block_table too short?), "
            f"got seq_lens[{r}] = {int(lens[r])}")
    if not is_concrete(block_table):
        return
    table = np.asarray(block_table)
    used = -(-lens // dims.page_size)  # pages each request reads
    read = np.arange(dims.max_pages)[None, :] < used[:, None]
    bad_ids = read & ((table < 0) | (table >= dims.num_pages))
    if bad_ids.any():
        r, i = (int(v) for v in np.argwhere(bad_ids)[0])
        raise ValueError(
            f"{where}: block_table entries read for request {r} must be page ids in "
            f"[0, num_pages) = [0, {dims.num_pages}), got block_table[{r}, {i}] = {int(table[r, i])} "
            f"(seq_lens[{r}] = {int(lens[r])} reads its first {int(used[r])} entries)")


def check_gpu_page_size(page_size: int, where: str = "mla_decode") -> None:
    """The GPU kernels' extra requirement (checked when lowering for CUDA; the CPU kernel takes
    any page size)."""
    if not (MIN_GPU_PAGE_SIZE <= page_size <= MAX_GPU_PAGE_SIZE and page_size & (page_size - 1) == 0):
        raise ValueError(
            f"{where}: on CUDA, kv_cache must have a power-of-two page_size in "
            f"[{MIN_GPU_PAGE_SIZE}, {MAX_GPU_PAGE_SIZE}] (dimension 1), got page_size = {page_size}")


def check_gpu_kv_format(kernel: str, fp8: bool, where: str = "mla_decode") -> None:
    """An FP8 cache on CUDA (checked when lowering for CUDA): only kernels that read the format
    may get it (FP8_KERNELS, from cuda/runtime/kernel_select.h; the handler refuses the rest too,
    e.g. a JAX_MLA_KERNEL that names one). "auto" takes one of them when there is any."""
    if not fp8:
        return
    readers = ", ".join(repr(k) for k in FP8_KERNELS)
    if kernel == "auto":
        if not FP8_KERNELS:
            raise ValueError(
                f"{where}: on CUDA, no kernel reads an FP8 kv_cache (uint8 rows of {FP8_ROW_BYTES} "
                f"bytes) yet; run the call on the CPU, or unpack the cache with unpack_fp8_kv")
        return
    if kernel not in FP8_KERNELS:
        which = f"kernels that read it: {readers}" if FP8_KERNELS else "no CUDA kernel reads it yet"
        raise ValueError(
            f"{where}: kernel {kernel!r} does not read an FP8 kv_cache (uint8 rows of "
            f"{FP8_ROW_BYTES} bytes); {which}")


# ----------------------------------------------------------------------------------------------
# Static (non-array) parameters
# ----------------------------------------------------------------------------------------------


def check_softmax_scale(softmax_scale: Any, where: str = "mla_decode") -> float:
    """Returns the scale as a Python float. It must be static: a Python or NumPy number."""
    if isinstance(softmax_scale, jax.Array) or isinstance(softmax_scale, jax.core.Tracer):
        raise TypeError(
            f"{where}: softmax_scale must be a static Python or NumPy number (it is compiled into the "
            f"kernel call), got a JAX array of shape {tuple(softmax_scale.shape)}; pass a float, "
            f"or mark it static under jit")
    if isinstance(softmax_scale, np.ndarray) and softmax_scale.shape == ():
        softmax_scale = softmax_scale[()]
    if isinstance(softmax_scale, (bool, np.bool_)) or not isinstance(softmax_scale, numbers.Real):
        raise TypeError(
            f"{where}: softmax_scale must be a static Python or NumPy real number, "
            f"got {type(softmax_scale).__name__}")
    value = float(softmax_scale)
    if not np.isfinite(value) or abs(value) > float(np.finfo(np.float32).max):
        raise ValueError(f"{where}: softmax_scale must be finite in float32, got {value}")
    if not np.float32(value) > 0:  # also refuses positive values that round to 0 in float32
        # The GPU kernels take the row max of the unscaled scores and scale it afterwards, which is
        # the max of the scaled scores only for a positive scale; zero would make every key equal.
        raise ValueError(f"{where}: softmax_scale must be positive, got {value}")
    return value


def check_bool(name: str, value: Any, where: str = "mla_decode") -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{where}: {name} must be a Python bool, got {type(value).__name__}")
    return bool(value)


def check_kernel(kernel: Any, where: str = "mla_decode") -> str:
    """The static `kernel` argument: which CUDA kernel to run (ignored on the CPU)."""
    if not isinstance(kernel, str):
        raise TypeError(f"{where}: kernel must be a str, one of {_KERNEL_CHOICES}, "
                        f"got {type(kernel).__name__}")
    if kernel not in KERNELS:
        raise ValueError(f"{where}: kernel must be one of {_KERNEL_CHOICES}, got {kernel!r}")
    return kernel


def check_batch_invariant(batch_invariant: Any, invariant_chunk: Any, where: str = "mla_decode") -> int:
    """The static batch_invariant / invariant_chunk arguments; returns the primitives' chunk_blocks:
    0 for the default split-KV plans, else the chunk in BLOCK_N-token blocks."""
    if not isinstance(batch_invariant, (bool, np.bool_)):
        raise TypeError(f"{where}: batch_invariant must be a Python bool, got {type(batch_invariant).__name__}")
    if invariant_chunk is None:
        return DEFAULT_INVARIANT_CHUNK // BLOCK_N if batch_invariant else 0
    if not batch_invariant:
        raise ValueError(f"{where}: invariant_chunk is the chunk of the batch_invariant plan; it needs "
                         f"batch_invariant=True, got invariant_chunk={invariant_chunk!r} with "
                         f"batch_invariant=False")
    if isinstance(invariant_chunk, (bool, np.bool_)) or not isinstance(invariant_chunk, numbers.Integral):
        raise TypeError(f"{where}: invariant_chunk (batch_invariant's chunk, in tokens) must be a Python "
                        f"int, got {type(invariant_chunk).__name__}")
    c = int(invariant_chunk)
    if c < BLOCK_N or c > MAX_INVARIANT_CHUNK or c % BLOCK_N:
        raise ValueError(f"{where}: invariant_chunk (batch_invariant's chunk, in tokens) must be a multiple "
                         f"of {BLOCK_N} in [{BLOCK_N}, {MAX_INVARIANT_CHUNK}], got {c}")
    return c // BLOCK_N


def check_chunk_blocks(chunk_blocks: Any, where: str = "mla_decode") -> int:
    """The primitives' static chunk_blocks: 0, or batch_invariant's chunk in BLOCK_N-token blocks."""
    if isinstance(chunk_blocks, (bool, np.bool_)) or not isinstance(chunk_blocks, numbers.Integral):
        raise TypeError(f"{where}: chunk_blocks (batch_invariant's chunk) must be a Python int, "
                        f"got {type(chunk_blocks).__name__}")
    if not 0 <= int(chunk_blocks) <= MAX_INVARIANT_CHUNK // BLOCK_N:
        raise ValueError(f"{where}: chunk_blocks (batch_invariant's chunk in {BLOCK_N}-token blocks) must be "
                         f"in [0, {MAX_INVARIANT_CHUNK // BLOCK_N}], got {int(chunk_blocks)}")
    return int(chunk_blocks)


def check_num_parts(num_parts: Any, batch: int, where: str = "decode_schedule") -> int:
    if isinstance(num_parts, (bool, np.bool_)) or not isinstance(num_parts, numbers.Integral):
        raise TypeError(f"{where}: num_parts must be a Python int, got {type(num_parts).__name__}")
    n = int(num_parts)
    if n < 1 or schedule_size(batch, n) > _INT32_MAX:
        raise ValueError(f"{where}: num_parts must be a positive int small enough for an int32 "
                         f"schedule, got {n}")
    return n


def check_int_in_range(name: str, value: Any, lo: int, hi: int, where: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{where}: {name} must be a Python int, got {type(value).__name__}")
    if not lo <= int(value) <= hi:
        raise ValueError(f"{where}: {name} must be in [{lo}, {hi}], got {int(value)}")
    return int(value)


# ----------------------------------------------------------------------------------------------
# Schedules
# ----------------------------------------------------------------------------------------------


def check_seq_lens_only(seq_lens: Any, where: str = "decode_schedule") -> int:
    """seq_lens on its own (decode_schedule): rank 1, int32, non-empty. Returns b."""
    shape = _shape(seq_lens)
    if len(shape) != 1 or shape[0] < 1:
        raise ValueError(f"{where}: seq_lens must have shape (b,) with b >= 1, got shape {shape}")
    _check_int32(seq_lens, "seq_lens", where)
    return shape[0]


def check_concrete_seq_lens_nonnegative(seq_lens: Any, where: str = "decode_schedule") -> None:
    if is_concrete(seq_lens):
        lens = np.asarray(seq_lens)
        if (lens < 0).any():
            r = int(np.argmax(lens < 0))
            raise ValueError(f"{where}: seq_lens must be >= 0, got seq_lens[{r}] = {int(lens[r])}")


def _parts_of_length(n: int, batch: int, invariant: bool) -> int:
    """num_parts of a schedule of n elements, or 0 when no num_parts >= 1 gives that length."""
    parts, rem = divmod(n - schedule_size(batch, 0, invariant), PART_FIELDS)
    return parts if rem == 0 and parts >= 1 else 0


def _schedule_shape_text(invariant: bool) -> str:
    extra = COMBINE_HEADER + 1 + (INVARIANT_FIELDS if invariant else 0)
    return f"(num_parts * {PART_FIELDS} + 2 * b + {extra},)"


def schedule_num_parts(schedule: Any, batch: int, invariant: bool = False, where: str = "mla_decode") -> int:
    """num_parts encoded by the length of a schedule array from decode_schedule; invariant: the
    call's batch_invariant, which the schedule must have been made with (its length tells)."""
    shape = _shape(schedule)
    n = shape[0] if len(shape) == 1 else -1
    parts = _parts_of_length(n, batch, invariant) if len(shape) == 1 else 0
    if not parts:
        if len(shape) == 1 and _parts_of_length(n, batch, not invariant):
            raise ValueError(
                f"{where}: schedule was made by decode_schedule with batch_invariant="
                f"{not invariant} but this call has batch_invariant={invariant}; pass the same "
                f"batch_invariant (and invariant_chunk) to both (schedule shape {shape}, b = {batch})")
        raise ValueError(
            f"{where}: schedule must have shape {_schedule_shape_text(invariant)} "
            f"with b = {batch} "
            f"and num_parts >= 1 (as returned by decode_schedule for the same seq_lens"
            f"{' with batch_invariant=True' if invariant else ''}), "
            f"got shape {shape}")
    _check_int32(schedule, "schedule", where, hint=False)
    return parts


def check_schedule_operand(schedule: Any, batch: int, num_parts: int, where: str,
                           chunk_blocks: int = 0) -> None:
    """The primitive's schedule operand: int32 (0,) [computed in-op] or (schedule_size,) of the
    plan kind chunk_blocks says (0: default, else batch-invariant)."""
    shape = _shape(schedule)
    invariant = chunk_blocks > 0
    expected = schedule_size(batch, num_parts, invariant)
    if shape not in ((0,), (expected,)):
        raise ValueError(
            f"{where}: schedule must have shape (0,) or "
            f"{_schedule_shape_text(invariant)} = "
            f"({expected},) for num_parts = {num_parts}, b = {batch}, batch_invariant = {invariant}, "
            f"got shape {shape}")
    _check_int32(schedule, "schedule", where, hint=False)


# ----------------------------------------------------------------------------------------------
# Paged cache update (update_kv_cache)
# ----------------------------------------------------------------------------------------------


class CacheUpdateDims(NamedTuple):
    batch: int
    new_tokens: int
    num_pages: int
    page_size: int
    max_pages: int
    kv_fp8: bool = False  # kv_cache holds FP8 rows: new_latent is quantized (pack_fp8_kv)


def check_cache_update_operands(kv_cache: Any, new_latent: Any, block_table: Any, positions: Any,
                                where: str = "update_kv_cache") -> CacheUpdateDims:
    """Ranks, dims and dtypes of update_kv_cache's operands; returns the problem's dims.

    A bfloat16 / float16 cache takes new_latent of its own dtype; a uint8 cache (FP8 rows) takes
    new_latent in bfloat16, float16 or float32, which update_kv_cache quantizes."""
    num_pages, page_size = _check_kv_cache_shape(kv_cache, where)
    kv_dtype = _dtype(kv_cache)
    fp8 = kv_dtype == _UINT8
    if not fp8 and kv_dtype not in _FLOAT_DTYPES:
        raise TypeError(
            f"{where}: kv_cache must have dtype bfloat16 or float16, got {_dtype_name(kv_dtype)} "
            f"(or {_FP8_HINT})")

    nl_shape = _shape(new_latent)
    if len(nl_shape) != 3 or nl_shape[-1] != HEAD_DIM_QK:
        raise ValueError(
            f"{where}: new_latent must have shape (b, s_new, {HEAD_DIM_QK}) (rank 3, last dimension "
            f"{HEAD_DIM_QK}: the 512 compressed-KV values then the 64 RoPE key values), "
            f"got shape {nl_shape}")
    b, s_new, _ = nl_shape
    if b < 1 or s_new < 1:
        raise ValueError(
            f"{where}: new_latent must have b >= 1 requests and s_new >= 1 tokens, got shape {nl_shape}")
    if fp8:
        nl_dtype = _dtype(new_latent)
        if nl_dtype not in _PACK_DTYPES:
            raise TypeError(
                f"{where}: new_latent must have dtype bfloat16, float16 or float32 for a uint8 "
                f"(FP8) kv_cache (its rows are quantized as pack_fp8_kv does), got "
                f"{_dtype_name(nl_dtype)}")
    else:
        _check_same_dtype(new_latent, "new_latent", kv_dtype, "kv_cache", where,
                          hint=" (convert it explicitly, e.g. with .astype(kv_cache.dtype))")

    bt_shape = _check_block_table(block_table, b, "new_latent", where)

    pos_shape = _shape(positions)
    if pos_shape != (b, s_new):
        raise ValueError(
            f"{where}: positions must have shape (b, s_new) = ({b}, {s_new}) like new_latent's first "
            f"two dimensions, got shape {pos_shape}")
    _check_int32(positions, "positions", where)
    if num_pages + b * s_new > _INT32_MAX:
        raise ValueError(
            f"{where}: kv_cache has {num_pages} pages; with {b * s_new} new tokens the page indices "
            f"no longer fit in int32")
    return CacheUpdateDims(b, s_new, num_pages, page_size, bt_shape[1], fp8)


def _first_true(mask: np.ndarray) -> tuple[int, ...] | None:
    """Index of the first True element of mask (row-major), or None."""
    hits = np.argwhere(mask)
    return tuple(int(v) for v in hits[0]) if hits.size else None


def check_concrete_positions(positions: Any, block_table: Any, dims: CacheUpdateDims,
                             where: str = "update_kv_cache") -> None:
    """Value checks at call time when positions (and block_table) are concrete: every position
    >= 0 fits the block table and lands on a page of the cache. Negative positions are padding
    (not written). Traced values are not checked: such writes are dropped."""
    if not is_concrete(positions):
        return
    pos = np.asarray(positions)
    capacity = dims.max_pages * dims.page_size
    bad = _first_true(pos >= capacity)
    if bad:
        r, t = bad
        raise ValueError(
            f"{where}: positions must be < max_pages * page_size = {dims.max_pages} * "
            f"{dims.page_size} = {capacity} (or negative for padding, not written), "
            f"got positions[{r}, {t}] = {int(pos[r, t])}")
    if not is_concrete(block_table):
        return
    table = np.asarray(block_table)
    written = pos >= 0
    cols = np.where(written, pos // dims.page_size, 0)
    pages = np.take_along_axis(table, cols, axis=1)
    bad = _first_true(written & ((pages < 0) | (pages >= dims.num_pages)))
    if bad:
        r, t = bad
        raise ValueError(
            f"{where}: the page written by each new token must be a page id in [0, num_pages) = "
            f"[0, {dims.num_pages}), got block_table[{r}, {int(cols[r, t])}] = {int(pages[r, t])} "
            f"for positions[{r}, {t}] = {int(pos[r, t])}")
    rows = (pages.astype(np.int64) * dims.page_size + pos % dims.page_size)[written]
    uniq, counts = np.unique(rows, return_counts=True)
    if (counts > 1).any():
        row = int(uniq[np.argmax(counts > 1)])
        hits = [tuple(int(v) for v in rt) for rt in np.argwhere(written)[rows == row]]
        raise ValueError(
            f"{where}: two new tokens write the same cache row (page {row // dims.page_size}, slot "
            f"{row % dims.page_size}): positions{list(hits[0])} and positions{list(hits[1])}; "
            f"positions must be distinct within a request and requests must not share the pages "
            f"they write")


# FP8 latent cache rows (jax_mla._fp8).


def check_fp8_pack_rows(rows: Any, where: str = "pack_fp8_kv") -> None:
    """rows: [..., 576] bfloat16, float16 or float32."""
    shape = _shape(rows)
    if len(shape) < 1 or shape[-1] != HEAD_DIM_QK:
        raise ValueError(
            f"{where}: rows must have shape (..., {HEAD_DIM_QK}) (last dimension {HEAD_DIM_QK}: the "
            f"512 compressed-KV values then the 64 RoPE key values), got shape {shape}")
    dt = _dtype(rows)
    if dt not in _PACK_DTYPES:
        raise TypeError(
            f"{where}: rows must have dtype bfloat16, float16 or float32, got {_dtype_name(dt)}")


def check_fp8_packed(packed: Any, where: str = "unpack_fp8_kv") -> None:
    """packed: [..., FP8_ROW_BYTES] uint8."""
    shape = _shape(packed)
    if len(shape) < 1 or shape[-1] != FP8_ROW_BYTES:
        raise ValueError(
            f"{where}: packed must have shape (..., {FP8_ROW_BYTES}) (one {FP8_ROW_BYTES}-byte FP8 "
            f"row per token, as pack_fp8_kv returns), got shape {shape}")
    dt = _dtype(packed)
    if dt != _UINT8:
        raise TypeError(f"{where}: packed must have dtype uint8, got {_dtype_name(dt)}")


def check_fp8_unpack_dtype(dtype: Any, where: str = "unpack_fp8_kv") -> np.dtype:
    """dtype: bfloat16, float16 or float32 (anything np.dtype accepts naming one of them)."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(
            f"{where}: dtype must be bfloat16, float16 or float32, got {dtype!r}") from None
    if dt not in _PACK_DTYPES:
        raise TypeError(
            f"{where}: dtype must be bfloat16, float16 or float32, got {_dtype_name(dt)}")
    return dt


# Sparse decode (mla_decode_sparse).


class SparseDims(NamedTuple):
    batch: int
    seq_q: int
    heads_q: int
    num_pages: int
    page_size: int
    topk: int
    kv_fp8: bool

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size


def check_sparse_operands(q: Any, kv_cache: Any, indices: Any, topk_length: Any = None,
                          attn_sink: Any = None, where: str = "mla_decode_sparse",
                          primitive: bool = False) -> SparseDims:
    """Shapes and dtypes of mla_decode_sparse's operands. topk_length / attn_sink may be None, or
    (for the primitive) arrays of shape (0,) meaning absent; the primitive also takes a (b, h_q)
    attn_sink (one row per request: vmap over per-instance sinks)."""
    b, s_q, h_q, num_pages, page_size, fp8 = _check_q_and_kv_cache(q, kv_cache, where)
    if num_pages * page_size > _INT32_MAX:
        raise ValueError(
            f"{where}: kv_cache has num_pages * page_size = {num_pages * page_size} token slots, more "
            f"than int32 indices address ({_INT32_MAX})")
    idx_shape = _shape(indices)
    if len(idx_shape) != 3 or idx_shape[:2] != (b, s_q) or idx_shape[2] < 1:
        raise ValueError(
            f"{where}: indices must have shape (b, s_q, topk) = ({b}, {s_q}, topk >= 1) with b, s_q "
            f"from q, got shape {idx_shape}")
    if idx_shape[2] > _INT32_MAX:
        raise ValueError(f"{where}: indices has topk = {idx_shape[2]} > {_INT32_MAX}")
    _check_int32(indices, "indices", where)
    if topk_length is not None and _shape(topk_length) != (0,):
        if _shape(topk_length) != (b,):
            raise ValueError(
                f"{where}: topk_length must have shape (b,) = ({b},) with b from q, got shape "
                f"{_shape(topk_length)}")
        _check_int32(topk_length, "topk_length", where)
    if attn_sink is not None and _shape(attn_sink) != (0,):
        if _shape(attn_sink) != (h_q,) and not (primitive and _shape(attn_sink) == (b, h_q)):
            raise ValueError(
                f"{where}: attn_sink must have shape (h_q,) = ({h_q},) with h_q from q, got shape "
                f"{_shape(attn_sink)}")
        if _dtype(attn_sink) != np.dtype(np.float32):
            raise TypeError(f"{where}: attn_sink must have dtype float32, got {_dtype_name(_dtype(attn_sink))}")
    return SparseDims(b, s_q, h_q, num_pages, page_size, idx_shape[2], fp8)


def check_gpu_sparse(dims: SparseDims, where: str = "mla_decode_sparse") -> None:
    """What the CUDA path of mla_decode_sparse needs (checked when lowering for CUDA; the handler
    checks it again): each of the b * s_q query tokens is one request of the device scheduler, and
    an FP8 cache only while the portable kernel, which runs every sparse call, reads it. Any page
    size works: the GPU sees the cache as pages of one token."""
    queries = dims.batch * dims.seq_q
    if queries > MAX_GPU_BATCH:
        raise ValueError(
            f"{where}: on CUDA, b * s_q = {dims.batch} * {dims.seq_q} = {queries} query tokens exceed "
            f"the limit of {MAX_GPU_BATCH} (each is one request of the device scheduler); split the call")
    if dims.kv_fp8 and "portable" not in FP8_KERNELS:
        raise ValueError(
            f"{where}: on CUDA, the portable kernel (which runs every sparse call) does not read an FP8 "
            f"kv_cache (uint8 rows of {FP8_ROW_BYTES} bytes) yet; run the call on the CPU, or unpack the "
            f"cache with unpack_fp8_kv")


def check_concrete_sparse(indices: Any, topk_length: Any, dims: SparseDims,
                          where: str = "mla_decode_sparse") -> None:
    """Value checks at call time on concrete inputs (under jit the CPU kernel reports a bad index,
    the GPU makes that query token's output NaN):
    topk_length[r] in [0, topk]; every counted index -1 or a slot in [0, num_pages * page_size)."""
    counts = None
    if topk_length is not None:
        if not is_concrete(topk_length):
            return  # which indices count is unknown: the kernel checks them
        counts = np.asarray(topk_length)
        bad = np.nonzero((counts < 0) | (counts > dims.topk))[0]
        if bad.size:
            r = int(bad[0])
            raise ValueError(
                f"{where}: topk_length must satisfy 0 <= topk_length[r] <= topk = {dims.topk}, got "
                f"topk_length[{r}] = {int(counts[r])}")
    if not is_concrete(indices):
        return
    idx = np.asarray(indices)
    counted = np.ones(idx.shape, bool) if counts is None else (
        np.arange(dims.topk)[None, None, :] < counts[:, None, None])
    bad_idx = counted & (idx != -1) & ((idx < 0) | (idx >= dims.num_slots))
    if bad_idx.any():
        r, t, k = (int(v) for v in np.argwhere(bad_idx)[0])
        raise ValueError(
            f"{where}: indices[{r}, {t}, {k}] = {int(idx[r, t, k])} (request {r}, query token {t}) is "
            f"neither -1 nor a token slot page_id * page_size + row in [0, num_pages * page_size) = "
            f"[0, {dims.num_slots})")
