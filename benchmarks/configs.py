"""The benchmark configurations, and how their FLOPs and bytes are counted.

The first seven are the configurations of ../shared/design/mla-decode-facts.md (FlashMLA's own
benchmark shapes, bf16, page size 64); the next four add a small batch at long context, multi-token
causal decode with few heads, a large batch with half the heads, and DeepSeek-V3's tensor-parallel
shard at TP8 (16 heads a GPU). benchmarks/bench_peers.py times FlashMLA and FlashAttention-3 on
them in the same process; no reference time is stored here.
  FLOPs = 2 * s_q * sum(seq_len) * h_q * (576 + 512)
  bytes = 2 * (sum(seq_len) * 576 + b * s_q * h_q * (576 + 512))
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np

# Ceilings of an H200 (facts file), used only where a run cannot measure its own machine's.
COPY_GBPS = 4274.0     # device-to-device copy, read + write counted
MATMUL_TFLOPS = 685.0  # bf16 8192^3, sustained


@dataclasses.dataclass(frozen=True)
class Config:
    name: str
    batch: int
    seq_q: int
    heads: int
    seq_len: int | None          # fixed length, or None for varied lengths
    causal: bool = False
    # Varied lengths: the mean of FlashMLA's benchmark distribution, max(int(N(mean, mean / 2)), s_q)
    # drawn with Python's random.seed(0). With mean 4096 and b = 128 this reproduces the reference's
    # lengths exactly (mean 4116.9, min 1, max 9128, 526,961 tokens; the facts file: "1..9128, mean
    # 4117"). Until 2026-12-03 this config drew uniform lengths in [1, 9128] (mean 4663: 13% more
    # tokens than the reference timed).
    varied_mean: int | None = None

    def seq_lens(self) -> np.ndarray:
        if self.varied_mean is None:
            return np.full((self.batch,), self.seq_len, np.int32)
        rng = random.Random(0)
        m = self.varied_mean
        return np.array([max(int(rng.normalvariate(m, m / 2)), self.seq_q) for _ in range(self.batch)], np.int32)

    def flops(self) -> float:
        return 2.0 * self.seq_q * float(self.seq_lens().sum()) * self.heads * (576 + 512)

    def bytes(self, kv_row_bytes: int = 2 * 576) -> float:
        """Bytes a call must move: the cached rows (kv_row_bytes a token: 1152 in bf16, 656 for the
        FP8 cache) plus q and out in bf16."""
        return (float(self.seq_lens().sum()) * kv_row_bytes
                + 2.0 * self.batch * self.seq_q * self.heads * (576 + 512))

    def floor_us(self, copy_gbps: float = COPY_GBPS, matmul_tflops: float = MATMUL_TFLOPS) -> float:
        """The roofline floor: the larger of bytes / copy rate and FLOPs / matmul rate, in us."""
        return max(self.bytes() / (copy_gbps * 1e3), self.flops() / (matmul_tflops * 1e6))

    def calls_per_step(self, copy_gbps: float = COPY_GBPS, matmul_tflops: float = MATMUL_TFLOPS,
                       step_us: float = 3000.0, lo: int = 16, hi: int = 128) -> int:
        """Back-to-back calls per timed step: enough that a step lasts step_us at the floor (real
        calls are slower), so that the step's one launch and synchronisation add ~1%."""
        return int(min(hi, max(lo, -(-step_us // self.floor_us(copy_gbps, matmul_tflops)))))


CONFIGS = [
    Config("b128_sq1_h128_4k", 128, 1, 128, 4096),
    Config("b128_sq2_h128_4k_causal", 128, 2, 128, 4096, causal=True),
    Config("b64_sq1_h16_8k", 64, 1, 16, 8192),
    Config("b32_sq1_h64_4k", 32, 1, 64, 4096),
    Config("b1_sq1_h128_32k", 1, 1, 128, 32768),
    Config("b16_sq1_h128_1k", 16, 1, 128, 1024),
    Config("b128_sq1_h128_varied", 128, 1, 128, None, varied_mean=4096),
    Config("b4_sq1_h128_8k", 4, 1, 128, 8192),
    Config("b64_sq4_h32_2k_causal", 64, 4, 32, 2048, causal=True),
    Config("b256_sq1_h64_2k", 256, 1, 64, 2048),
    Config("b128_sq1_h16_1k", 128, 1, 16, 1024),
]

# Shapes the split plans treat differently, timed by bench_decode.py only when named exactly in --only:
# small non-uniform batches (b16/h128, b32/h64 with varied lengths), where each request is cut into
# equal pieces, and one row block with more requests than parts (b200/h64, b256/h16), where the
# batch is cut along one line.
EXTRA_CONFIGS = [
    Config("b16_sq1_h128_varied2k", 16, 1, 128, None, varied_mean=2048),
    Config("b32_sq1_h64_varied", 32, 1, 64, None, varied_mean=4096),
    Config("b200_sq1_h64_varied", 200, 1, 64, None, varied_mean=4096),
    Config("b256_sq1_h16_varied", 256, 1, 16, None, varied_mean=4096),
]


def find(name: str) -> Config:
    """The configuration of that exact name, among CONFIGS and EXTRA_CONFIGS."""
    for c in CONFIGS + EXTRA_CONFIGS:
        if c.name == name:
            return c
    raise KeyError(f"no benchmark configuration {name!r}; known: {[c.name for c in CONFIGS + EXTRA_CONFIGS]}")
