"""DeepSeek-V3 MLA attention with random weights: prefill a prompt, then decode through jax_mla.

    python3 examples/deepseek_v3_mla.py                          # DeepSeek-V3 sizes, 1 layer
    python3 examples/deepseek_v3_mla.py --heads 16 --layers 2 --prompt 64 --steps 8
    XLA_FLAGS=--xla_force_host_platform_device_count=2 python3 examples/deepseek_v3_mla.py \
        --heads 16                                               # batch sharded over 2 devices

A stack of `--layers` pre-norm attention blocks (x + MLA(RMSNorm(x)); no MLP, no vocabulary) with
DeepSeek-V3's attention shapes: q_lora_rank 1536, kv_lora_rank 512, qk_nope 128 + qk_rope 64 per
query head, v_head 128, 128 heads, hidden size 7168, YaRN RoPE (factor 40) whose mscale is folded
into the softmax scale (192 ** -0.5 * mscale ** 2).

- Prefill: the prompt (random hidden states, ragged lengths) runs through naive causal attention;
  its latent rows (512 normalised compressed-KV values + 64 RoPE'd key values) are written into
  each layer's paged cache with jax_mla.update_kv_cache (padding positions -1 for short prompts).
- Decode: each step appends one token per request (update_kv_cache, cache donated) and attends in
  the absorbed form: W_UK folded into the query (q_nope @ W_UK -> 512 latent columns next to the
  64 RoPE columns), jax_mla.mla_decode over the paged cache (one decode_schedule per step shared
  by the layers), W_UV applied to its 512-wide output, then W_O.
- Check: every step, every layer's output is compared with naive non-absorbed attention in
  float32 (keys and values decompressed from an unpaged float32 history of the latents).
- Devices: the GPU when jax has one, else the CPU. With several devices the batch is sharded
  over them (data parallel) as most model code does it: NamedShardings on a jax.sharding.Mesh
  (Auto axes) as the jitted steps' in_shardings / out_shardings, XLA propagating them. Each
  device holds its requests' pages of every cache, and mla_decode / update_kv_cache run per
  device with no collective.

Prints per-step latency and tokens/s with a progress bar; exits with status 1 on a mismatch.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import re
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import jax_mla

F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class Config:
    d_model: int = 7168
    heads: int = 128
    q_lora_rank: int = 1536
    kv_lora_rank: int = 512      # fixed by the kernel: 512 + 64 = 576
    qk_nope: int = 128
    qk_rope: int = 64            # fixed by the kernel
    v_head: int = 128
    rope_theta: float = 10000.0
    rope_factor: float = 40.0    # YaRN
    original_max_positions: int = 4096
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 1.0

    @property
    def softmax_scale(self) -> float:
        """DeepSeek-V3: (qk_nope + qk_rope) ** -0.5 * mscale ** 2, YaRN's mscale folded in."""
        m = yarn_mscale(self.rope_factor, self.mscale_all_dim)
        return (self.qk_nope + self.qk_rope) ** -0.5 * m * m


# ----------------------------------------------------------------------------------------------
# YaRN RoPE
# ----------------------------------------------------------------------------------------------

def yarn_mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_inv_freq(cfg: Config) -> np.ndarray:
    """Per rotary pair: extrapolated (original) frequencies for the fast dimensions, interpolated
    (divided by the factor) for the slow ones, blended linearly in between."""
    dim, base = cfg.qk_rope, cfg.rope_theta

    def correction_dim(rotations):
        return dim * math.log(cfg.original_max_positions / (rotations * 2 * math.pi)) / (
            2 * math.log(base))

    low = max(math.floor(correction_dim(cfg.beta_fast)), 0)
    high = min(math.ceil(correction_dim(cfg.beta_slow)), dim - 1)
    freq = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    ramp = np.clip((np.arange(dim // 2) - low) / max(high - low, 1e-3), 0, 1)
    extrapolate = 1.0 - ramp
    return (1 / (cfg.rope_factor * freq) * (1 - extrapolate) + 1 / freq * extrapolate).astype(
        np.float32)


def rope(x, positions, inv_freq, attention_scale):
    """Rotate-half RoPE of x (..., 64) at positions (broadcastable to x.shape[:-1])."""
    angles = positions[..., None].astype(F32) * inv_freq           # (..., 32)
    cos, sin = jnp.cos(angles) * attention_scale, jnp.sin(angles) * attention_scale
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


# ----------------------------------------------------------------------------------------------
# Weights and projections (shared by the absorbed and the naive paths)
# ----------------------------------------------------------------------------------------------

def init_layer(rng: np.random.Generator, cfg: Config, dtype):
    """Random weights (NumPy: quicker here than compiling jax's RNG), scaled by fan-in ** -0.5."""
    h, d = cfg.heads, cfg.d_model

    def dense(shape, fan_in):
        w = rng.standard_normal(shape, dtype=np.float32)
        w *= fan_in ** -0.5
        return w.astype(dtype)

    return {
        "attn_norm": np.ones((d,), dtype),
        "w_dq": dense((d, cfg.q_lora_rank), d),                              # W_DQ
        "q_norm": np.ones((cfg.q_lora_rank,), dtype),
        "w_uq": dense((cfg.q_lora_rank, h, cfg.qk_nope + cfg.qk_rope), cfg.q_lora_rank),
        "w_dkv": dense((d, cfg.kv_lora_rank + cfg.qk_rope), d),              # W_DKV and W_KR
        "kv_norm": np.ones((cfg.kv_lora_rank,), dtype),
        "w_uk": dense((cfg.kv_lora_rank, h, cfg.qk_nope), cfg.kv_lora_rank),
        "w_uv": dense((cfg.kv_lora_rank, h, cfg.v_head), cfg.kv_lora_rank),
        "w_o": dense((h, cfg.v_head, d), h * cfg.v_head),
    }


def rms_norm(x, weight, eps=1e-6):
    x = x.astype(F32)
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * weight.astype(F32)


def mm(eq, a, b):
    """einsum in the weights' dtype with float32 accumulation and result."""
    return jnp.einsum(eq, a.astype(b.dtype), b, preferred_element_type=F32)


def latent_rows(p, cfg, rope_args, h, positions):
    """The cached row of each token: [RMSNorm(h W_DKV) (512), RoPE(h W_KR) (64)], float32."""
    kv = mm("...d,dc->...c", h, p["w_dkv"])
    c = rms_norm(kv[..., : cfg.kv_lora_rank], p["kv_norm"])
    k_pe = rope(kv[..., cfg.kv_lora_rank:], positions, *rope_args)
    return jnp.concatenate([c, k_pe], axis=-1)


def queries(p, cfg, rope_args, h, positions):
    """Per head q_nope (..., H, 128) and RoPE'd q_pe (..., H, 64), float32."""
    cq = rms_norm(mm("...d,dr->...r", h, p["w_dq"]), p["q_norm"])
    q = mm("...r,rhe->...he", cq, p["w_uq"])
    return q[..., : cfg.qk_nope], rope(q[..., cfg.qk_nope:], positions[..., None], *rope_args)


def naive_attention(p, cfg, q_nope, q_pe, rows, visible):
    """Non-absorbed MLA in float32: keys/values decompressed from the latent rows.

    q_nope (b, s, H, 128), q_pe (b, s, H, 64), rows (b, T, 576), visible (b, s, T) bool."""
    w_uk, w_uv, w_o = (p[k].astype(F32) for k in ("w_uk", "w_uv", "w_o"))
    c, k_pe = rows[..., : cfg.kv_lora_rank], rows[..., cfg.kv_lora_rank:]
    k_nope = jnp.einsum("btc,chn->bthn", c, w_uk)
    v = jnp.einsum("btc,chv->bthv", c, w_uv)
    scores = (jnp.einsum("bshn,bthn->bsht", q_nope, k_nope) +
              jnp.einsum("bshr,btr->bsht", q_pe, k_pe)) * cfg.softmax_scale
    scores = jnp.where(visible[:, :, None, :], scores, -jnp.inf)
    probs = jax.nn.softmax(scores, axis=-1)
    probs = jnp.where(visible[:, :, None, :], probs, 0.0)  # rows with no visible key (padding)
    o = jnp.einsum("bsht,bthv->bshv", probs, v)
    return jnp.einsum("bshv,hvd->bsd", o, w_o)


# ----------------------------------------------------------------------------------------------
# Prefill (naive attention; writes the paged caches) and decode (absorbed, through jax_mla)
# ----------------------------------------------------------------------------------------------

def prefill(layers, caches, x, block_table, prompt_lens, *, cfg, rope_args):
    """x (b, T, d) prompt hidden states. Returns (next-token input (b, d), caches, float32 latent
    histories per layer (b, T, 576))."""
    b, t = x.shape[:2]
    pos = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    valid = pos < prompt_lens[:, None]
    visible = (pos[:, None, :] <= pos[:, :, None]) & valid[:, None, :]   # causal, (b, T, T)
    new_caches, histories = [], []
    for p, cache in zip(layers, caches):
        h = rms_norm(x, p["attn_norm"])
        rows = latent_rows(p, cfg, rope_args, h, pos)
        write_at = jnp.where(valid, pos, -1)  # -1: padding past a short prompt, not written
        new_caches.append(jax_mla.update_kv_cache(cache, rows.astype(cache.dtype), block_table,
                                                  write_at))
        histories.append(jnp.where(valid[..., None], rows, 0.0))
        q_nope, q_pe = queries(p, cfg, rope_args, h, pos)
        x = x + naive_attention(p, cfg, q_nope, q_pe, rows, visible)
    last = jnp.take_along_axis(x, (prompt_lens - 1)[:, None, None], axis=1)[:, 0]
    return rms_norm(last, jnp.ones((), F32)), new_caches, histories


def decode_step(layers, caches, x, block_table, seq_lens, *, cfg, rope_args):
    """One token per request through every layer, absorbed. Returns (per-layer inputs, per-layer
    latent rows, output (b, d), the next token's input, caches); the caller's jit donates the
    caches."""
    pos = seq_lens                                   # the new token's position
    schedule = jax_mla.decode_schedule(seq_lens + 1, num_heads=cfg.heads)  # shared by the layers
    inputs, new_rows, new_caches = [], [], []
    for p, cache in zip(layers, caches):
        inputs.append(x)
        h = rms_norm(x, p["attn_norm"])
        rows = latent_rows(p, cfg, rope_args, h, pos)                       # (b, 576)
        new_rows.append(rows)
        cache = jax_mla.update_kv_cache(cache, rows[:, None].astype(cache.dtype), block_table,
                                        pos[:, None])
        new_caches.append(cache)
        q_nope, q_pe = queries(p, cfg, rope_args, h, pos)          # (b, H, 128), (b, H, 64)
        q_latent = mm("bhn,chn->bhc", q_nope, p["w_uk"])                     # W_UK absorbed
        q = jnp.concatenate([q_latent, q_pe], axis=-1)[:, None].astype(cache.dtype)
        o_latent = jax_mla.mla_decode(q, cache, block_table, seq_lens + 1,
                                      softmax_scale=cfg.softmax_scale, schedule=schedule)
        o = mm("bhc,chv->bhv", o_latent[:, 0], p["w_uv"])                    # W_UV on 512 wide
        x = x + mm("bhv,hvd->bd", o, p["w_o"])
    next_input = rms_norm(x, jnp.ones((), F32))  # the next token's input: this output, normalised
    return inputs, new_rows, x, next_input, new_caches


def naive_decode_check(layers, inputs, histories, seq_lens, *, cfg, rope_args):
    """Each layer's output for the same input, naive, in float32 (histories hold the new token)."""
    outs = []
    for p, x, rows in zip(layers, inputs, histories):
        h = rms_norm(x, p["attn_norm"])
        q_nope, q_pe = queries(jax.tree.map(lambda w: w.astype(F32), p), cfg, rope_args, h,
                               seq_lens)
        visible = (jnp.arange(rows.shape[1]) <= seq_lens[:, None])[:, None, :]
        y = naive_attention(p, cfg, q_nope[:, None], q_pe[:, None], rows, visible)
        outs.append(x + y[:, 0])
    return outs


# ----------------------------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------------------------

def parse_args(argv=None):
    c = Config()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=["auto", "cpu", "gpu"], default="auto")
    p.add_argument("--batch", type=int, default=4, help="requests")
    p.add_argument("--heads", type=int, default=c.heads, help="query heads, 1..128")
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--prompt", type=int, default=64, help="longest prompt (others are shorter)")
    p.add_argument("--steps", type=int, default=8, help="decode steps (new tokens per request)")
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--d-model", type=int, default=c.d_model)
    p.add_argument("--q-lora-rank", type=int, default=c.q_lora_rank)
    p.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    p.add_argument("--no-shard", action="store_true", help="use one device even if there are more")
    p.add_argument("--tolerance", type=float, default=2e-2,
                   help="max relative L2 error of a layer's attention output vs naive float32")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if not 1 <= a.heads <= 128:
        p.error("--heads must be in [1, 128] (the kernel's limit)")
    for name in ("batch", "layers", "prompt", "steps", "page_size", "d_model", "q_lora_rank"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    return a


def pick_devices(kind):
    if kind in ("auto", "gpu"):
        try:
            return jax.devices("gpu")
        except RuntimeError:
            if kind == "gpu":
                sys.exit("error: --device gpu but jax sees no GPU")
    return jax.devices("cpu")


def progress(i, n, width=24):
    done = width * i // n
    return "[" + "#" * done + "." * (width - done) + f"] {i:>{len(str(n))}}/{n}"


def rel_err(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def main(argv=None) -> int:
    a = parse_args(argv)
    cfg = Config(d_model=a.d_model, heads=a.heads, q_lora_rank=a.q_lora_rank)
    dtype = jnp.dtype(a.dtype)
    devices = pick_devices(a.device)
    n_dev = 1 if a.no_shard else len(devices)
    if a.batch % n_dev:
        n_dev = math.gcd(a.batch, n_dev)
    devices = devices[:n_dev]
    b, page = a.batch, a.page_size
    rng = np.random.default_rng(a.seed)

    # Pages: every request reserves room for its prompt and the decoded tokens. With n devices the
    # cache's page axis is split n ways and request r's pages lie in its device's slice (global
    # ids), pages handed out in shuffled order within each slice.
    max_pages = -(-(a.prompt + a.steps) // page)
    per_dev_requests, per_dev_pages = b // n_dev, (b // n_dev) * max_pages + 1
    num_pages = n_dev * per_dev_pages
    block_table = np.concatenate([
        (s * per_dev_pages + rng.permutation(per_dev_pages)[:per_dev_requests * max_pages])
        .reshape(per_dev_requests, max_pages) for s in range(n_dev)]).astype(np.int32)
    prompt_lens = rng.integers(max(1, a.prompt // 2), a.prompt + 1, size=b).astype(np.int32)
    prompt_lens[0] = a.prompt

    if n_dev > 1:
        mesh = Mesh(np.asarray(devices), ("data",))  # Auto axes, as jax.sharding.Mesh makes them
        batch, replicated = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
        # Both steps take (layers, caches, batch-major arrays...) and return batch-major arrays
        # and caches (whose pages are split like the requests).
        shardings = dict(in_shardings=(replicated, batch, batch, batch, batch),
                         out_shardings=batch)

        def put(x, *spec):  # spec: the mesh axis of each leading dimension (none: replicated)
            return jax.device_put(x, NamedSharding(mesh, P(*spec)))
    else:
        shardings = {}

        def put(x, *spec):
            return jax.device_put(x, devices[0])

    layers = [jax.tree.map(put, init_layer(rng, cfg, dtype)) for _ in range(a.layers)]
    caches = [put(np.zeros((num_pages, page, 576), dtype), "data") for _ in range(a.layers)]
    block_table_d = put(block_table, "data")
    # YaRN's attention factor is mscale(factor, mscale) / mscale(factor, mscale_all_dim) = 1 here.
    rope_args = (jnp.asarray(yarn_inv_freq(cfg)), 1.0)
    x_prompt = put(rng.standard_normal((b, a.prompt, cfg.d_model)).astype(np.float32), "data")
    fixed = dict(cfg=cfg, rope_args=rope_args)

    dev = devices[0]
    print(f"jax {jax.__version__}, jax_mla {jax_mla.__version__}, {n_dev} x {dev.platform} "
          f"({dev.device_kind}){', batch sharded over devices' if n_dev > 1 else ''}")
    print(f"DeepSeek-V3 MLA: {a.layers} layer(s), d_model {cfg.d_model}, {cfg.heads} heads, "
          f"q_lora {cfg.q_lora_rank}, kv_lora {cfg.kv_lora_rank}, qk {cfg.qk_nope}+{cfg.qk_rope}, "
          f"v {cfg.v_head}, softmax scale {cfg.softmax_scale:.5f} (YaRN mscale "
          f"{yarn_mscale(cfg.rope_factor, cfg.mscale_all_dim):.4f}), {a.dtype}")
    print(f"batch {b}, prompts {prompt_lens.min()}..{prompt_lens.max()} tokens, {a.steps} decode "
          f"steps, paged cache {num_pages} pages x {page} rows per layer")

    t0 = time.perf_counter()
    prefill_fn = jax.jit(functools.partial(prefill, **fixed), donate_argnums=1, **shardings)
    x, caches, histories = jax.block_until_ready(
        prefill_fn(layers, caches, x_prompt, block_table_d, put(prompt_lens, "data")))
    print(f"prefill: {b * int(prompt_lens.mean())} tokens (naive attention, compile included) "
          f"in {time.perf_counter() - t0:.2f} s")

    step_fn = jax.jit(functools.partial(decode_step, **fixed), donate_argnums=1, **shardings)
    check_fn = jax.jit(functools.partial(naive_decode_check, **fixed))
    seq_lens = put(prompt_lens, "data")
    t0 = time.perf_counter()
    step_fn = step_fn.lower(layers, caches, x, block_table_d, seq_lens).compile()
    print(f"decode step compiled in {time.perf_counter() - t0:.2f} s")
    if n_dev > 1:
        found = sorted(set(re.findall(r"\b(all-gather|all-reduce|all-to-all|collective-permute|"
                                      r"reduce-scatter)\b", step_fn.as_text())))
        print(f"collectives in the compiled decode step: {', '.join(found) or 'none'}")
    hist = [np.concatenate([np.asarray(h), np.zeros((b, a.steps, 576), np.float32)], axis=1)
            for h in histories]
    times, worst = [], 0.0
    tty = sys.stdout.isatty()
    for step in range(a.steps):
        t0 = time.perf_counter()
        inputs, rows, out, x_next, caches = jax.block_until_ready(
            step_fn(layers, caches, x, block_table_d, seq_lens))
        times.append(time.perf_counter() - t0)
        lens = np.asarray(seq_lens)
        for layer in range(a.layers):  # the naive path gets the float32 rows of the new token
            hist[layer][np.arange(b), lens] = np.asarray(rows[layer])
        # The check runs on gathered (unsharded) host copies.
        want = check_fn(layers, [np.asarray(i) for i in inputs], hist, lens)
        got_next = [*inputs[1:], out]
        errs = [rel_err(np.asarray(g) - np.asarray(i), np.asarray(w) - np.asarray(i))
                for g, w, i in zip(got_next, want, inputs)]
        worst = max(worst, *errs)
        line = (f"{progress(step + 1, a.steps)}  step {times[-1] * 1e3:8.2f} ms  "
                f"{b / times[-1]:9.1f} tok/s  attention rel err {max(errs):.1e}")
        print(("\r" if tty else "") + line, end="" if tty and step + 1 < a.steps else "\n",
              flush=True)
        if max(errs) > a.tolerance or not np.isfinite(errs).all():
            print(f"\nMISMATCH at step {step}: layer errors {errs} (tolerance {a.tolerance})")
            return 1
        seq_lens = put(lens + 1, "data")
        x = x_next
    steady = times[1:] or times
    print(f"OK: {a.steps} decode steps x {b} requests, worst attention rel err {worst:.1e}; "
          f"median step {np.median(steady) * 1e3:.2f} ms = {b / np.median(steady):.1f} tok/s "
          f"({a.layers} layer(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
