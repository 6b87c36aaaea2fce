"""Shared test cases for jax_mla: random paged caches with poisoned unused memory.

Every case gets fresh data from np.random.default_rng(case.seed). Each request's keys are first
drawn as a dense (seq_len, 576) array (what the float64 brute force reads), then scattered into
pages whose ids are a random permutation, so the paging is what is under test. Memory a correct
kernel must never read is poisoned:
  - pages no request uses, and the rows past seq_len in a request's last page, hold NaN;
  - block-table slots past a request's pages hold invalid ids (-1, num_pages, INT32_MAX, ...),
    so reading one is out of bounds rather than quietly a valid page.

make_fp8(case) builds the same kind of problem over an FP8 cache (uint8 rows of 656 bytes,
jax_mla.pack_fp8_kv): its dense truth is unpack_fp8_kv of the packed rows, and its unused memory
is poisoned byte-wise (NaN e4m3 values, NaN / inf scales, NaN RoPE values).

make_sparse / sparse_brute_force: the same for mla_decode_sparse (random index lists into a cache
whose unselected pages are poisoned, and float64 on the gathered rows).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from jax_mla import pack_fp8_kv, unpack_fp8_kv
from jax_mla.reference import mla_decode_reference

HEAD_DIM_QK = 576
HEAD_DIM_V = 512
BLOCK_N = 64  # tokens per scheduling block / KV tile

DTYPES = {"bfloat16": np.dtype(jnp.bfloat16), "float16": np.dtype(np.float16)}


@dataclasses.dataclass(frozen=True)
class Case:
    lens: tuple[int, ...]       # seq_lens, one per request (b = len(lens))
    s_q: int = 1
    h_q: int = 16
    page_size: int = 64
    dtype: str = "bfloat16"
    causal: bool = False
    softmax_scale: float | None = None
    seed: int = 0
    extra_pages: int = 3        # pages no request uses (poisoned)
    extra_slots: int = 2        # block-table columns past the longest request (poisoned)
    rank4_cache: bool = False   # pass the cache as (P, page, 1, 576)
    q_std: float = 1.0

    @property
    def b(self) -> int:
        return len(self.lens)

    @property
    def id(self) -> str:
        lens = ",".join(map(str, self.lens)) if len(self.lens) <= 4 else \
            f"{','.join(map(str, self.lens[:3]))},..{len(self.lens)}"
        scale = "" if self.softmax_scale is None else f"-sc{self.softmax_scale:g}"
        return (f"b{self.b}-sq{self.s_q}-h{self.h_q}-pg{self.page_size}-{self.dtype[:4]}"
                f"{'-causal' if self.causal else ''}{scale}{'-r4' if self.rank4_cache else ''}"
                f"-L[{lens}]-s{self.seed}")

    @property
    def work(self) -> int:
        """Rough cost: query rows times keys."""
        return self.s_q * self.h_q * sum(self.lens)

    def replace(self, **kw) -> "Case":
        return dataclasses.replace(self, **kw)


@dataclasses.dataclass
class CaseData:
    case: Case
    q: np.ndarray             # (b, s_q, h_q, 576) dtype
    kv_cache: np.ndarray      # (P, page, 576) or (P, page, 1, 576) dtype
    block_table: np.ndarray   # (b, max_pages) int32
    seq_lens: np.ndarray      # (b,) int32
    dense_kv: list[np.ndarray]  # per request (seq_len, 576), dtype: the unpaged truth

    @property
    def args(self):
        return self.q, self.kv_cache, self.block_table, self.seq_lens

    @property
    def scale(self) -> float:
        s = self.case.softmax_scale
        return HEAD_DIM_QK ** -0.5 if s is None else s


_POISON_IDS = (-1, -7, 2**31 - 1, -(2**31))


def make(case: Case) -> CaseData:
    rng = np.random.default_rng(case.seed)
    dt = DTYPES[case.dtype]
    b, page = case.b, case.page_size
    q = (rng.standard_normal((b, case.s_q, case.h_q, HEAD_DIM_QK)) * case.q_std).astype(dt)
    dense = [rng.standard_normal((n, HEAD_DIM_QK)).astype(dt) for n in case.lens]

    pages_of = [math.ceil(n / page) for n in case.lens]
    used = sum(pages_of)
    num_pages = used + case.extra_pages
    if num_pages == 0:
        num_pages = 1
    max_pages = max(max(pages_of), 1) + case.extra_slots

    ids = rng.permutation(num_pages).astype(np.int32)
    kv = np.full((num_pages, page, HEAD_DIM_QK), np.nan, dtype=dt)
    poison = np.array(_POISON_IDS + (num_pages, num_pages + 5), dtype=np.int64)
    table = rng.choice(poison, size=(b, max_pages)).astype(np.int32)
    nxt = 0
    for r in range(b):
        for i in range(pages_of[r]):
            pid = ids[nxt]
            nxt += 1
            table[r, i] = pid
            rows = dense[r][i * page:(i + 1) * page]
            kv[pid, :rows.shape[0]] = rows
    if case.rank4_cache:
        kv = kv.reshape(num_pages, page, 1, HEAD_DIM_QK)
    return CaseData(case, q, kv, table, np.asarray(case.lens, np.int32), dense)


# ----------------------------------------------------------------------------------------------
# FP8 caches (uint8 rows of FP8_ROW_BYTES, jax_mla._fp8)
# ----------------------------------------------------------------------------------------------

FP8_ROW_BYTES = 656
# Latent tile magnitudes of the FP8 cases: mostly unit, some tiny (the 1e-4 scale floor applies:
# values round to few e4m3 bits or flush to 0), some large (scales well above 1).
_FP8_TILE_MAGS = np.array([1.0, 1.0, 1.0, 1.0, 0.25, 4.0, 1e-3, 20.0])


def _fp8_rows(rng, n: int) -> np.ndarray:
    """(n, 576) float32 latent rows with a random magnitude per 128-value tile."""
    rows = rng.standard_normal((n, HEAD_DIM_QK)).astype(np.float32)
    mags = rng.choice(_FP8_TILE_MAGS, size=(n, 4)).astype(np.float32)
    rows[:, :HEAD_DIM_V] *= np.repeat(mags, HEAD_DIM_V // 4, axis=1)
    return rows


def fp8_poison_rows(rng, n: int) -> np.ndarray:
    """(n, 656) uint8 rows a kernel must not read: finite-looking e4m3 bytes whose tile scales are
    NaN or +inf (so only the scale bytes poison them) and NaN RoPE values."""
    rows = rng.integers(0, 0x7E, size=(n, FP8_ROW_BYTES), dtype=np.uint8)  # 0..0x7D: finite e4m3
    scales = rng.choice(np.array([0x7FC00000, 0x7F800000, 0xFFC00001], np.uint32), size=(n, 4))
    rows[:, 512:528] = scales.astype("<u4").view(np.uint8).reshape(n, 16)
    rows[:, 528:] = np.full((n, 64), 0x7FC0, "<u2").view(np.uint8).reshape(n, 128)
    return rows


def make_fp8(case: Case) -> CaseData:
    """The case over an FP8 cache: q in case.dtype (bf16 / fp16), kv_cache uint8 (P, page, 656) (or
    (P, page, 1, 656) with rank4_cache). dense_kv holds unpack_fp8_kv of each request's rows in
    float32: the ground truth the float64 brute force reads. Unused pages are all 0xFF bytes (NaN
    values, NaN scales, NaN RoPE); unused rows of used pages are fp8_poison_rows."""
    rng = np.random.default_rng(case.seed)
    dt = DTYPES[case.dtype]
    b, page = case.b, case.page_size
    q = (rng.standard_normal((b, case.s_q, case.h_q, HEAD_DIM_QK)) * case.q_std).astype(dt)
    # Packed and unpacked in one call over a power-of-two row count (few distinct shapes to
    # compile across cases), then cut per request.
    total = sum(case.lens)
    rows = _fp8_rows(rng, 1 << max(total - 1, 63).bit_length())
    all_packed = np.asarray(pack_fp8_kv(rows))
    all_dense = np.asarray(unpack_fp8_kv(all_packed, jnp.float32))
    cuts = np.cumsum((0,) + tuple(case.lens))
    packed = [all_packed[a:e] for a, e in zip(cuts[:-1], cuts[1:])]
    dense = [all_dense[a:e] for a, e in zip(cuts[:-1], cuts[1:])]

    pages_of = [math.ceil(n / page) for n in case.lens]
    num_pages = max(sum(pages_of) + case.extra_pages, 1)
    max_pages = max(max(pages_of), 1) + case.extra_slots

    ids = rng.permutation(num_pages).astype(np.int32)
    kv = np.full((num_pages, page, FP8_ROW_BYTES), 0xFF, np.uint8)
    poison = np.array(_POISON_IDS + (num_pages, num_pages + 5), dtype=np.int64)
    table = rng.choice(poison, size=(b, max_pages)).astype(np.int32)
    nxt = 0
    for r in range(b):
        for i in range(pages_of[r]):
            pid = ids[nxt]
            nxt += 1
            table[r, i] = pid
            rows = packed[r][i * page:(i + 1) * page]
            kv[pid, :rows.shape[0]] = rows
            kv[pid, rows.shape[0]:] = fp8_poison_rows(rng, page - rows.shape[0])
    if case.rank4_cache:
        kv = kv.reshape(num_pages, page, 1, FP8_ROW_BYTES)
    return CaseData(case, q, kv, table, np.asarray(case.lens, np.int32), dense)


def max_abs_value(data: CaseData) -> float:
    """Largest |v| over all cached value columns (the first 512): out is a convex combination of
    value rows, so absolute fp32 noise in out scales with it."""
    return max([float(np.abs(k[:, :HEAD_DIM_V]).max()) for k in data.dense_kv if k.size] + [0.0])


# ----------------------------------------------------------------------------------------------
# Float64 brute force on the dense, unpaged copy (independent of jax and of the paging)
# ----------------------------------------------------------------------------------------------


def brute_force(data: CaseData, causal: bool | None = None, scale: float | None = None):
    """(out, lse) in float64, one request and one query token at a time."""
    case = data.case
    causal = case.causal if causal is None else causal
    scale = data.scale if scale is None else scale
    b, s_q, h_q = case.b, case.s_q, case.h_q
    out = np.zeros((b, s_q, h_q, HEAD_DIM_V))
    lse = np.full((b, s_q, h_q), -np.inf)
    q = data.q.astype(np.float64)
    for r in range(b):
        keys = data.dense_kv[r].astype(np.float64)  # (n, 576)
        n = keys.shape[0]
        for t in range(s_q):
            visible = max(n - s_q + t + 1, 0) if causal else n
            if visible == 0:
                continue
            k = keys[:visible]
            s = scale * (q[r, t] @ k.T)               # (h_q, visible)
            m = s.max(axis=1, keepdims=True)
            p = np.exp(s - m)
            denom = p.sum(axis=1)
            out[r, t] = (p @ k[:, :HEAD_DIM_V]) / denom[:, None]
            lse[r, t] = m[:, 0] + np.log(denom)
    return out, lse


def max_abs_score(data: CaseData, scale: float | None = None) -> float:
    """Largest |scale * q . k| over all cached keys: fp32 rounding errors of scores (and hence of
    out and lse) grow with it, so tolerances of fp32 results scale with it."""
    scale = data.scale if scale is None else scale
    m = 0.0
    q = data.q.astype(np.float64)
    for r, keys in enumerate(data.dense_kv):
        if keys.shape[0]:
            m = max(m, float(np.abs(np.einsum("thd,kd->thk", q[r], keys.astype(np.float64))).max()))
    return abs(scale) * m


def len_with_splits(splits: int, num_parts: int) -> int:
    """A seq_len that the split-KV plan (cuda/common/scheduler.h) cuts into exactly `splits`
    pieces when it is the only request, for splits = num_parts, num_parts - 1, num_parts - 2 or
    num_parts - 5. The request costs nb + 5 units; with nb = num_parts * k - 5 blocks a part holds
    k units and the request's 5 overhead units leave it floor(5 / k) parts short of num_parts."""
    short = num_parts - splits
    k = {0: 6, 1: 3, 2: 2}.get(short)
    if k is None:
        if short != 5:
            raise ValueError(f"no closed form for {splits} splits over {num_parts} parts")
        k = 1
    nb = num_parts * k - 5
    if nb < 1:
        raise ValueError(f"num_parts {num_parts} too small for {splits} splits")
    return nb * BLOCK_N - BLOCK_N // 3  # a partial last block


# ----------------------------------------------------------------------------------------------
# Sweeps
# ----------------------------------------------------------------------------------------------


def _lengths(rng, b: int, page: int, s_q: int, long_len: int) -> list[int]:
    """b lengths mixing the interesting kinds: 0, 1, < s_q, page and block boundaries +-1, long."""
    k = int(rng.integers(1, 4))
    kinds = [
        0, 1, max(s_q - 1, 0),
        page - 1, page, page + 1,
        k * page - 1, k * page, k * page + 1,
        BLOCK_N - 1, BLOCK_N, BLOCK_N + 1, 2 * BLOCK_N + 1,
        int(rng.integers(2, 400)),
        int(rng.integers(long_len * 2 // 3, long_len + 1)),
    ]
    return [max(int(x), 0) for x in rng.choice(np.array(kinds), size=b)]


def random_sweep(num: int, *, master_seed: int, page_sizes, heads=(1, 3, 16, 64, 128), max_b=8,
                 max_s_q=4, long_len=3000, budget=1_500_000, dtypes=("bfloat16", "float16")):
    """`num` random cases (deterministic for a master seed). `budget` caps s_q * h_q * sum(lens)
    so that the whole sweep stays cheap on a small CPU: long lengths go to cases with few rows."""
    rng = np.random.default_rng(master_seed)
    cases = []
    for i in range(num):
        b = int(rng.integers(1, max_b + 1))
        s_q = int(rng.integers(1, max_s_q + 1))
        h_q = int(rng.choice(np.array(heads)))
        page = int(rng.choice(np.array(page_sizes)))
        lens = _lengths(rng, b, page, s_q, long_len)
        while s_q * h_q * sum(lens) > budget:
            j = int(np.argmax(lens))
            lens[j] = int(rng.integers(0, max(lens[j] // 4, 2)))
        scale = None if rng.random() < 0.5 else float(rng.choice(np.array([0.02, 0.1, 192 ** -0.5])))
        cases.append(Case(
            lens=tuple(lens), s_q=s_q, h_q=h_q, page_size=page,
            dtype=str(rng.choice(np.array(dtypes))), causal=bool(rng.random() < 0.5),
            softmax_scale=scale, seed=master_seed * 1000 + i,
            extra_pages=int(rng.integers(0, 4)), extra_slots=int(rng.integers(0, 3)),
            rank4_cache=bool(rng.random() < 0.2)))
    return cases


def edge_cases(page_sizes=(1, 16, 64, 128)) -> list[Case]:
    """Hand-picked cases every kernel must get right."""
    cases = []
    seed = 7000
    for page in page_sizes:
        for causal in (False, True):
            seed += 1
            cases.append(Case(lens=(0, 1, page - 1 if page > 1 else 2, page, page + 1, 3, 0),
                              s_q=3, h_q=3, page_size=page, causal=causal, seed=seed))
    cases += [
        Case(lens=(0,), s_q=1, h_q=1, seed=7100),                       # nothing to attend to
        Case(lens=(0, 0, 0), s_q=4, h_q=16, causal=True, seed=7101),
        Case(lens=(2,), s_q=4, h_q=16, causal=True, seed=7102),         # causal, len < s_q
        Case(lens=(BLOCK_N - 1, BLOCK_N, BLOCK_N + 1), h_q=64, seed=7103),
        Case(lens=(2500,), s_q=2, h_q=16, causal=True, seed=7104),      # long, one request
        Case(lens=(1, 2900), h_q=128, page_size=128, seed=7105),         # long + tiny
        Case(lens=(300, 5), s_q=8, h_q=16, dtype="float16", seed=7106),  # s_q = 8 (max)
        Case(lens=(100,), h_q=128, softmax_scale=0.3, q_std=2.0, seed=7107),  # peaky softmax
        Case(lens=(77, 64), h_q=16, rank4_cache=True, seed=7108),
    ]
    return cases


# ----------------------------------------------------------------------------------------------
# Sparse decode (mla_decode_sparse): random index lists and float64 on the gathered rows
# ----------------------------------------------------------------------------------------------


def make_sparse(seed, *, b=2, s_q=1, h_q=16, topk=7, page_size=16, num_pages=12, dtype="bfloat16", fp8=False,
                p_invalid=0.2, dup=True, scale_q=1.0):
    """Random problem: q (b, s_q, h_q, 576), kv_cache (num_pages, page_size, 576 | 656 uint8) whose
    unselected pages are poisoned, indices (b, s_q, topk) int32 (-1 with probability p_invalid, the
    last one of each token a duplicate of its first with dup), and the float64 cache rows
    (num_pages * page_size, 576) the reference reads (unpack_fp8_kv of an FP8 cache)."""
    rng = np.random.default_rng(seed)
    slots = num_pages * page_size
    # Select from the first half of the pages only; poison the others.
    live = (num_pages + 1) // 2 * page_size
    idx = rng.integers(0, live, size=(b, s_q, topk)).astype(np.int32)
    if dup and topk > 1:
        idx[..., -1] = idx[..., 0]  # a slot listed twice counts twice
    idx[rng.random(idx.shape) < p_invalid] = -1
    q = (rng.standard_normal((b, s_q, h_q, HEAD_DIM_QK)) * scale_q).astype(DTYPES[dtype])
    if fp8:
        rows = _fp8_rows(rng, slots)
        packed = np.array(pack_fp8_kv(jnp.asarray(rows)))
        packed[live:] = fp8_poison_rows(rng, slots - live)
        kv = packed.reshape(num_pages, page_size, FP8_ROW_BYTES)
        rows64 = np.asarray(unpack_fp8_kv(jnp.asarray(packed), jnp.float32), np.float64)
    else:
        rows = rng.standard_normal((slots, HEAD_DIM_QK)).astype(DTYPES[dtype])
        rows[live:] = np.nan
        kv = rows.reshape(num_pages, page_size, HEAD_DIM_QK)
        rows64 = np.asarray(rows, np.float64)
    return q, kv, idx, rows64


def sparse_brute_force(q, rows64, idx, topk_length=None, scale=HEAD_DIM_QK ** -0.5, sink=None):
    """float64 softmax over each token's counted, valid indices (duplicates included): (out, lse).
    sink: (h_q,) attention sink logits or None."""
    q = np.asarray(q, np.float64)
    b, s_q, h_q, _ = q.shape
    out = np.zeros((b, s_q, h_q, HEAD_DIM_V))
    lse = np.full((b, s_q, h_q), -np.inf)
    for r in range(b):
        n = idx.shape[-1] if topk_length is None else min(max(int(topk_length[r]), 0), idx.shape[-1])
        for t in range(s_q):
            sel = idx[r, t, :n]
            sel = sel[sel != -1]
            if sel.size == 0:
                continue
            k = rows64[sel]                                   # (n, 576)
            s = q[r, t] @ k.T * scale                         # (h_q, n)
            m = s.max(-1, keepdims=True)
            p = np.exp(s - m)
            den = p.sum(-1)
            out[r, t] = (p @ k[:, :HEAD_DIM_V]) / den[:, None]
            lse[r, t] = m[:, 0] + np.log(den)
            if sink is not None:
                with np.errstate(over="ignore"):
                    out[r, t] *= 1.0 / (1.0 + np.exp(np.asarray(sink, np.float64) - lse[r, t]))[:, None]
    return out, lse


# ----------------------------------------------------------------------------------------------
# Comparing a kernel's result with the fp32 reference
# ----------------------------------------------------------------------------------------------

# Unit roundoff of the output dtype: the only error a kernel that accumulates in fp32 adds on top
# of fp32 noise is the final rounding of out, |round(x) - x| <= u |x|.
UNIT_ROUNDOFF = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}


def check_structure(out, lse, ref_lse):
    """Finite everywhere; rows with no visible key exactly out = 0, lse = -inf."""
    out = np.asarray(out, np.float64)
    lse = np.asarray(lse, np.float64)
    assert not np.isnan(out).any(), f"out has {int(np.isnan(out).sum())} NaN"
    assert np.isfinite(out).all(), "out has inf"
    empty = np.isneginf(np.asarray(ref_lse))
    assert not np.isnan(lse).any(), f"lse has {int(np.isnan(lse).sum())} NaN"
    np.testing.assert_array_equal(np.isneginf(lse), empty,
                                  err_msg="lse must be -inf exactly on rows with no visible key")
    assert (out[empty] == 0).all(), "out must be exactly 0 on rows with no visible key"
    assert np.isfinite(lse[~empty]).all(), "lse must be finite on rows with keys"
    return out, lse, empty


def assert_close_rounding_only(out, lse, ref_out, ref_lse, dtype: str, score_mag: float,
                               value_mag: float = 1.0):
    """Elementwise: |out - ref| <= u |ref| + atol (u: unit roundoff of dtype, atol: fp32 noise,
    relative to the values' magnitude value_mag when that exceeds 1)."""
    out, lse, empty = check_structure(out, lse, ref_lse)
    ref_out = np.asarray(ref_out, np.float64)
    ref_lse = np.asarray(ref_lse, np.float64)
    atol = (1e-5 + 2e-6 * score_mag) * max(value_mag, 1.0)
    err = np.abs(out - ref_out)
    bound = UNIT_ROUNDOFF[dtype] * np.abs(ref_out) + atol
    bad = err > bound
    if bad.any():
        i = tuple(int(v) for v in np.argwhere(bad)[0])
        raise AssertionError(
            f"out differs from the reference beyond rounding to {dtype} at {int(bad.sum())} of "
            f"{bad.size} elements; first at {i}: got {out[i]!r}, want {ref_out[i]!r} "
            f"(bound {bound[i]:.3g}); max |err|/bound = {float((err / bound).max()):.3g}")
    d = np.abs(lse[~empty] - ref_lse[~empty])
    lbound = 1e-5 * np.maximum(np.abs(ref_lse[~empty]), 1.0)
    if (d > lbound).any():
        raise AssertionError(f"lse differs from the reference by up to {d.max():.3g} "
                             f"(bound 1e-5 relative); max |err|/bound = {(d / lbound).max():.3g}")


def assert_close_rel_l2(out, lse, ref_out, ref_lse, out_tol=1e-2, lse_tol=1e-3):
    """Loose check for kernels that round intermediates (P) to 16 bits: relative L2 error of out
    and relative error of lse."""
    out, lse, empty = check_structure(out, lse, ref_lse)
    ref_out = np.asarray(ref_out, np.float64)
    ref_lse = np.asarray(ref_lse, np.float64)
    num = np.linalg.norm(out - ref_out)
    den = max(np.linalg.norm(ref_out), 1e-30)
    assert num / den <= out_tol, f"out relative L2 error {num / den:.3g} > {out_tol}"
    d = np.abs(lse[~empty] - ref_lse[~empty])
    if d.size:
        rel = (d / np.maximum(np.abs(ref_lse[~empty]), 1.0)).max()
        assert rel <= lse_tol, f"lse relative error {rel:.3g} > {lse_tol}"


@functools.partial(jax.jit, static_argnames=("softmax_scale", "causal", "out_dtype"))
def _reference_jit(q, kv_cache, block_table, seq_lens, *, softmax_scale, causal, out_dtype):
    return mla_decode_reference(q, kv_cache, block_table, seq_lens, softmax_scale=softmax_scale,
                                causal=causal, out_dtype=out_dtype)


def reference(data: CaseData, out_dtype=jnp.float32, **overrides):
    """The jitted fp32 reference on the case's inputs: (out, lse) as float64 NumPy arrays."""
    kw = dict(softmax_scale=data.case.softmax_scale, causal=data.case.causal)
    kw.update(overrides)
    out, lse = _reference_jit(*data.args, out_dtype=out_dtype, **kw)
    return np.asarray(out, np.float64), np.asarray(lse, np.float64)


def gpu_fp8_reader() -> bool:
    """Whether a CUDA kernel reads the FP8 cache in this build (cuda/runtime/kernel_select.h
    kReadsFp8Cache): the GPU tests that run an FP8 decode need one, the refusal tests do not."""
    import jax_mla
    return bool(jax_mla._validate.FP8_KERNELS)


NO_GPU_FP8_READER = ("no CUDA kernel reads the FP8 cache in this build: the portable kernel's FP8 path "
                     "joins kReadsFp8Cache (cuda/runtime/kernel_select.h) once these tests pass on a GPU")
