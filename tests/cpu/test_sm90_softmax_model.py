"""A float64 model of the SM90 consumers' online softmax (cuda/sm90/mainloop.cuh owner_step)
with its lazy reference rule (the reference moves only when a tile's max exceeds it by more than
kLazyRescaleSlack = 8, log2 units). It checks the algebra the kernel relies on, not the kernel:
O / l and reference + log2(l) are the softmax and its LSE; P never exceeds 2^slack; the rescale of
O is needed on almost no tile. The GPU side is tests/gpu/test_gpu.py::test_lazy_rescale_matches_reference."""
import numpy as np
import pytest

BLOCK_N = 64  # keys per tile (kBlockN)
LAZY_SLACK = 8.0  # kLazyRescaleSlack (cuda/common/config.h)


def move_reference(m, tile_max, slack):
    """The kernel's rule: the reference jumps to the tile's max only past the slack (-inf + slack is -inf)."""
    return np.where(tile_max > m + slack, tile_max, m)


def online_softmax(s, v, slack, rule=move_reference):
    """s: (rows, n) scores in log2 units; v: (n, d). Returns O, LSE (log2), the number of tiles after
    the first whose rescale changed some row (alpha != 1), and the largest P seen."""
    rows, n = s.shape
    m = np.full(rows, -np.inf)
    l = np.zeros(rows)
    o = np.zeros((rows, v.shape[1]))
    rescaled_tiles, p_max = 0, 0.0
    for t, k0 in enumerate(range(0, n, BLOCK_N)):
        tile = s[:, k0:k0 + BLOCK_N]
        m_new = rule(m, tile.max(axis=1), slack)
        with np.errstate(invalid="ignore"):
            alpha = np.where(np.isneginf(m), 0.0, np.exp2(m - m_new))
        if t > 0 and np.any(alpha != 1.0):  # the first tile's O is zero: the kernel skips it
            rescaled_tiles += 1
        p = np.exp2(tile - m_new[:, None])
        p_max = max(p_max, float(p.max()))
        l = l * alpha + p.sum(axis=1)
        o = o * alpha[:, None] + p @ v[k0:k0 + BLOCK_N]
        m = m_new
    return o / l[:, None], m + np.log2(l), rescaled_tiles, p_max


def softmax_reference(s, v):
    m = s.max(axis=1, keepdims=True)
    p = np.exp2(s - m)
    return (p @ v) / p.sum(axis=1, keepdims=True), m[:, 0] + np.log2(p.sum(axis=1))


def scores(kind, rows=16, n=4096, seed=0):
    rng = np.random.default_rng(seed)
    s = rng.standard_normal((rows, n)) * 2.0
    if kind == "ramp":  # the max grows by about 3 log2 units a tile: the reference must move
        s += np.arange(n) * (3.0 / BLOCK_N)
    return s


@pytest.mark.parametrize("kind", ["random", "ramp"])
def test_the_lazy_reference_gives_the_softmax(kind):
    s = scores(kind, n=1000)  # 1000: a partial last tile
    v = np.random.default_rng(1).standard_normal((s.shape[1], 32))
    o, lse, _, p_max = online_softmax(s, v, LAZY_SLACK)
    o_ref, lse_ref = softmax_reference(s, v)
    np.testing.assert_allclose(o, o_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, lse_ref, rtol=1e-12)
    assert p_max <= 2.0 ** LAZY_SLACK


def test_lazy_skips_the_rescale():
    s = scores("random")
    v = np.ones((s.shape[1], 1))
    *_, lazy_tiles, lazy_p_max = online_softmax(s, v, LAZY_SLACK)
    # Scores of std 2 never outgrow the first tile's max by 8.
    assert lazy_tiles == 0, lazy_tiles
    assert lazy_p_max > 1.0  # the reference did lag the max


def test_a_reference_that_never_moves_is_caught():
    """A mutant that keeps the first tile's max: P overflows the slack on ramping scores, so the
    bound that keeps fp16 P finite is what the rule above guarantees."""
    def stuck(m, tile_max, slack):
        return np.where(np.isneginf(m), tile_max, m)

    s = scores("ramp", n=1024)
    v = np.ones((s.shape[1], 1))
    *_, p_max = online_softmax(s, v, LAZY_SLACK, rule=stuck)
    assert p_max > 2.0 ** LAZY_SLACK
