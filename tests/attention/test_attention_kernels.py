"""The attention kernels (fastgp.kernels.attention) against naive masked-softmax attention.

Forward against the oracle's (O, logsumexp); the tangent against ``jax.jvp`` of the oracle and
the VJP against ``jax.vjp`` of it, in Pallas interpret mode and TPU interpret mode
(``pltpu.InterpretParams``), float32 at rtol 1e-5, bf16 against the float32 oracle at bf16
tolerance; the tangent/VJP pair against each other (<tangent(t), g> = <t, vjp(g)>); rows with no
valid key (causal row 0 with key 0 masked, a batch element with every key masked) give exact
zeros and nothing non-finite; queries at a non-zero offset among the keys (a sequence shard's),
with several query and key blocks, in every pass. The AOT tests compile each kernel for real
TPU generations.
"""

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from fastgp import _jax_private
from fastgp.kernels.attention import (
    flash_forward,
    flash_second_vjp,
    flash_tangent,
    flash_tangent_jvp,
    flash_vjp,
    flash_vjp_jvp,
)
from fastgp.kernels.attention.tiling import Blocks as FlashBlocks
from fastgp.kernels.attention.tiling import blocks as flash_blocks


@dataclasses.dataclass(frozen=True)
class Case:
    b: int
    h: int
    tq: int
    tk: int
    d: int
    dv: int
    causal: bool
    bq: int
    bk: int
    empty: str  # which rows have no valid key: "none", "first" (causal row 0), "batch" (b = 1)
    q_offset: int = 0  # the first query's position among the keys (a sequence shard's start)

    def __str__(self) -> str:
        kind = "causal" if self.causal else "full"
        offset = f"-at{self.q_offset}" if self.q_offset else ""
        return (
            f"b{self.b}h{self.h}-q{self.tq}k{self.tk}-d{self.d}v{self.dv}-{kind}{offset}"
            f"-bq{self.bq}bk{self.bk}-{self.empty}"
        )


CASES = [
    Case(1, 1, 128, 256, 32, 32, False, 128, 128, "none"),  # padded tail keys
    Case(2, 3, 256, 128, 64, 64, True, 256, 128, "first"),  # Tq > Tk, bq > bk
    Case(2, 2, 256, 512, 128, 64, True, 128, 256, "batch"),  # Tk > Tq: a key block no query sees
    Case(1, 2, 48, 40, 32, 32, True, 48, 40, "none"),  # whole short lengths as one block
]
# A sequence shard's queries at a non-zero offset among the keys, several query and key blocks
# each, causal, the tail keys padded: the causal skips (the last key block a query block sees,
# the first query block that sees a key block) must add the offset. One offset a whole number
# of blocks (the last of two sequence shards), one not.
OFFSET_CASES = [
    Case(1, 2, 64, 128, 32, 32, True, 32, 32, "none", q_offset=64),
    Case(1, 2, 64, 96, 32, 32, True, 32, 32, "none", q_offset=24),
]
MODES = {"interpret": True, "tpu-interpret": pltpu.InterpretParams()}
SCALE = 0.3


def naive(q, k, v, key_mask, causal, scale, q_offset=0):
    """Masked-softmax attention (O, logsumexp) in plain jnp, differentiable to any order; a row
    with no valid key gives O = 0, L = 0 (double-where guards keep its derivatives finite).
    Causal: query i (at position q_offset + i among the keys) sees key j <= q_offset + i."""
    s = scale * jnp.einsum("bhqd,bhkd->bhqk", q, k, precision="highest")
    valid = visible(key_mask, causal, q_offset, *s.shape[-2:])
    m = jax.lax.stop_gradient(jnp.max(jnp.where(valid, s, -jnp.inf), -1, keepdims=True))
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    e = jnp.exp(jnp.where(valid, s - m, -jnp.inf))
    total = jnp.sum(e, -1, keepdims=True)
    some = total > 0
    safe = jnp.where(some, total, 1.0)
    o = jnp.einsum("bhqk,bhkd->bhqd", e / safe, v, precision="highest")
    return o, jnp.where(some, m + jnp.log(safe), 0.0)[..., 0]


def visible(key_mask, causal, q_offset, tq, tk):
    """(B, 1, Tq, Tk) bool: the valid keys, and if causal those at or before each query's
    position q_offset + i."""
    valid = key_mask[:, None, None, :] != 0
    if causal:
        valid = valid & (jnp.arange(tk)[None, :] <= q_offset + jnp.arange(tq)[:, None])
    return valid


def key_mask_for(case: Case) -> np.ndarray:
    mask = np.ones((case.b, case.tk), np.int32)
    mask[:, case.tk - case.tk // 5 :] = 0  # the caller's padding
    if case.empty == "first":
        mask[case.b - 1, 0] = 0  # causal query 0 sees only key 0
    if case.empty == "batch":
        mask[case.b - 1] = 0
    return mask


def empty_rows(case: Case) -> np.ndarray:
    """(B, Tq) bool: the rows with no valid key."""
    rows = np.zeros((case.b, case.tq), bool)
    if case.empty == "first":
        rows[case.b - 1, 0] = True
    if case.empty == "batch":
        rows[case.b - 1] = True
    return rows


def inputs(case: Case, dtype=jnp.float32, seed=0):
    rng = np.random.default_rng(seed)
    shapes = {
        "q": (case.b, case.h, case.tq, case.d),
        "k": (case.b, case.h, case.tk, case.d),
        "v": (case.b, case.h, case.tk, case.dv),
    }
    primal = {n: jnp.asarray(rng.standard_normal(s), dtype) for n, s in shapes.items()}
    tangent = {n: jnp.asarray(rng.standard_normal(s), dtype) for n, s in shapes.items()}
    g_o = jnp.asarray(rng.standard_normal((case.b, case.h, case.tq, case.dv)), dtype)
    g_lse = jnp.asarray(rng.standard_normal((case.b, case.h, case.tq)), jnp.float32)
    return primal, tangent, g_o, g_lse, jnp.asarray(key_mask_for(case))


def options(case: Case, interpret):
    return dict(
        scale=SCALE,
        causal=case.causal,
        block_q=case.bq,
        block_k=case.bk,
        interpret=interpret,
        q_offset=case.q_offset,
    )


def f32(x):
    return jnp.asarray(x, jnp.float32)


def close(actual, expected, rtol):
    """Relative to the array's largest entry, so that entries near zero do not decide."""
    actual, expected = np.asarray(f32(actual)), np.asarray(f32(expected))
    assert np.all(np.isfinite(actual))
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * np.abs(expected).max())


def oracle(case, mask):
    return functools.partial(
        naive, key_mask=mask, causal=case.causal, scale=SCALE, q_offset=case.q_offset
    )


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES + OFFSET_CASES, ids=str)
def test_forward_matches_naive_attention(case, mode):
    p, _, _, _, mask = inputs(case)
    o, lse = flash_forward(p["q"], p["k"], p["v"], mask, **options(case, MODES[mode]))
    ref_o, ref_lse = oracle(case, mask)(p["q"], p["k"], p["v"])
    assert o.shape == (case.b, case.h, case.tq, case.dv) and o.dtype == jnp.float32
    assert lse.shape == (case.b, case.h, case.tq) and lse.dtype == jnp.float32
    close(o, ref_o, 1e-5)
    close(lse, ref_lse, 1e-5)
    empty = empty_rows(case)
    assert np.all(np.asarray(o)[empty.nonzero()[0], :, empty.nonzero()[1]] == 0)
    assert np.all(np.asarray(lse).transpose(0, 2, 1)[empty] == 0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES + OFFSET_CASES, ids=str)
def test_tangent_matches_jvp_of_naive_attention(case, mode):
    p, t, _, _, mask = inputs(case)
    fn = oracle(case, mask)
    (o, lse), (ref_do, ref_dlse) = jax.jvp(fn, (p["q"], p["k"], p["v"]), (t["q"], t["k"], t["v"]))
    do, dlse = flash_tangent(
        p["q"], p["k"], p["v"], o, lse, mask, t["q"], t["k"], t["v"], **options(case, MODES[mode])
    )
    assert do.shape == o.shape and do.dtype == jnp.float32 and dlse.shape == lse.shape
    close(do, ref_do, 1e-5)
    close(dlse, ref_dlse, 1e-5)
    empty = empty_rows(case)
    assert np.all(np.asarray(do)[empty.nonzero()[0], :, empty.nonzero()[1]] == 0)
    assert np.all(np.asarray(dlse).transpose(0, 2, 1)[empty] == 0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES + OFFSET_CASES, ids=str)
def test_vjp_matches_vjp_of_naive_attention(case, mode):
    p, _, g_o, g_lse, mask = inputs(case)
    (o, lse), pullback = jax.vjp(oracle(case, mask), p["q"], p["k"], p["v"])
    grads = flash_vjp(
        p["q"], p["k"], p["v"], o, lse, mask, g_o, g_lse, **options(case, MODES[mode])
    )
    for got, want, name in zip(grads, pullback((g_o, g_lse)), "qkv", strict=True):
        assert got.shape == p[name].shape and got.dtype == p[name].dtype
        close(got, want, 1e-5)
    empty = empty_rows(case)
    assert np.all(np.asarray(grads[0])[empty.nonzero()[0], :, empty.nonzero()[1]] == 0)


@pytest.mark.parametrize("case", CASES + OFFSET_CASES, ids=str)
def test_vjp_is_the_transpose_of_the_tangent(case):
    """<tangent(t), (g_o, g_lse)> = <t, vjp(g_o, g_lse)> with the same saved o, lse."""
    p, t, g_o, g_lse, mask = inputs(case, seed=1)
    opts = options(case, True)
    o, lse = flash_forward(p["q"], p["k"], p["v"], mask, **opts)
    do, dlse = flash_tangent(p["q"], p["k"], p["v"], o, lse, mask, t["q"], t["k"], t["v"], **opts)
    grads = flash_vjp(p["q"], p["k"], p["v"], o, lse, mask, g_o, g_lse, **opts)
    lhs = float(jnp.vdot(do, g_o) + jnp.vdot(dlse, g_lse))
    rhs = sum(float(jnp.vdot(t[n], g)) for n, g in zip("qkv", grads, strict=True))
    assert lhs == pytest.approx(rhs, rel=1e-5)


@pytest.mark.parametrize("mode", MODES)
def test_bf16_inputs_match_the_float32_oracle(mode):
    case = CASES[1]
    p, t, g_o, g_lse, mask = inputs(case, jnp.bfloat16, seed=2)
    opts = options(case, MODES[mode])
    fn = oracle(case, mask)
    p32, t32 = ({n: f32(x) for n, x in d.items()} for d in (p, t))
    (ref_o, ref_lse), (ref_do, ref_dlse) = jax.jvp(
        fn, (p32["q"], p32["k"], p32["v"]), (t32["q"], t32["k"], t32["v"])
    )
    _, pullback = jax.vjp(fn, p32["q"], p32["k"], p32["v"])

    o, lse = flash_forward(p["q"], p["k"], p["v"], mask, **opts)
    assert o.dtype == jnp.bfloat16 and lse.dtype == jnp.float32
    close(o, ref_o, 2e-2)
    close(lse, ref_lse, 1e-2)
    do, dlse = flash_tangent(p["q"], p["k"], p["v"], o, lse, mask, t["q"], t["k"], t["v"], **opts)
    assert do.dtype == jnp.bfloat16 and dlse.dtype == jnp.float32
    close(do, ref_do, 3e-2)
    close(dlse, ref_dlse, 3e-2)
    grads = flash_vjp(p["q"], p["k"], p["v"], o, lse, mask, g_o, g_lse, **opts)
    for got, want in zip(grads, pullback((f32(g_o), g_lse)), strict=True):
        assert got.dtype == jnp.bfloat16
        close(got, want, 3e-2)


def test_tpu_interpret_mode_finds_no_races():
    case = CASES[2]
    p, t, g_o, g_lse, mask = inputs(case)
    opts = options(case, pltpu.InterpretParams(detect_races=True, num_cores_or_threads=2))
    o, lse = flash_forward(p["q"], p["k"], p["v"], mask, **opts)
    flash_tangent(p["q"], p["k"], p["v"], o, lse, mask, t["q"], t["k"], t["v"], **opts)
    jax.block_until_ready(flash_vjp(p["q"], p["k"], p["v"], o, lse, mask, g_o, g_lse, **opts))
    state = _jax_private.resolve("tpu_interpret_state")
    assert state.races is not None and not state.races.races_found


# --- Second order: the passes' derivatives in their primal inputs (q, k, v, o, lse) ----------


def dense_tangent(q, k, v, o, lse, key_mask, dq, dk, dv, causal, q_offset=0):
    """The tangent pass as plain jnp at given (o, lse), every T_q x T_k array materialised: the
    oracle whose JAX derivatives in (q, k, v, o, lse) the second-order kernels must equal (its
    own value is held to jax.jvp of naive attention by the tangent tests above)."""
    mm = functools.partial(jnp.einsum, precision="highest")
    s = SCALE * mm("bhqd,bhkd->bhqk", q, k)
    valid = visible(key_mask, causal, q_offset, *s.shape[-2:])
    p = jnp.where(valid, jnp.exp(jnp.where(valid, s - lse[..., None], 0.0)), 0.0)
    ps = p * SCALE * (mm("bhqd,bhkd->bhqk", dq, k) + mm("bhqd,bhkd->bhqk", q, dk))
    mu = jnp.sum(ps, -1)
    return mm("bhqk,bhkd->bhqd", ps, v) + mm("bhqk,bhkd->bhqd", p, dv) - mu[..., None] * o, mu


def second_order_inputs(case, dtype=jnp.float32, seed=3):
    """Primal inputs with the forward's (o, lse), a tangent d, a cotangent g, a direction P_dot."""
    p, t, g_o, g_lse, mask = inputs(case, dtype, seed)
    opts = options(case, True)
    o, lse = flash_forward(p["q"], p["k"], p["v"], mask, **opts)
    primal = (p["q"], p["k"], p["v"], o, lse)
    rng = np.random.default_rng(seed + 1)
    dot = tuple(jnp.asarray(rng.standard_normal(x.shape), x.dtype) for x in primal)
    return primal, mask, (t["q"], t["k"], t["v"]), (g_o, g_lse), dot


def second_order_oracles(case, primal, mask, d, g, dot):
    """The three passes by JAX's autodiff of :func:`dense_tangent`, in float32."""
    primal, d, g, dot = (tuple(f32(x) for x in xs) for xs in (primal, d, g, dot))
    tangent = lambda *p: dense_tangent(*p, mask, *d, case.causal, case.q_offset)

    def vjp(*p):  # the tangent's transpose at p: linear, so taken at zero
        zeros = tuple(jnp.zeros_like(x) for x in p[:3])
        along = lambda *dd: dense_tangent(*p, mask, *dd, case.causal, case.q_offset)
        return jax.vjp(along, *zeros)[1](g)

    return {
        "tangent_jvp": jax.jvp(tangent, primal, dot)[1],
        "vjp_jvp": jax.jvp(vjp, primal, dot)[1],
        "second_vjp": jax.vjp(tangent, *primal)[1](g),
    }


def second_order_kernels(primal, mask, d, g, dot, opts):
    return {
        "tangent_jvp": flash_tangent_jvp(*primal, mask, *d, *dot, **opts),
        "vjp_jvp": flash_vjp_jvp(*primal, mask, *g, *dot, **opts),
        "second_vjp": flash_second_vjp(*primal, mask, *d, *g, **opts),
    }


def assert_matches(got, want, primal, rtol):
    """Each pass's results shaped and typed as the slot it returns, and close to the oracle's."""
    like = {"tangent_jvp": primal[3:], "vjp_jvp": primal[:3], "second_vjp": primal}
    for name in want:
        assert len(got[name]) == len(want[name]) == len(like[name])
        for x, y, ref in zip(got[name], want[name], like[name], strict=True):
            assert x.shape == ref.shape and x.dtype == ref.dtype, name
            close(x, y, rtol)


# TPU interpret mode simulates the chip's memory: on the two cases that reach every masking path
# and the offset cases in make check, on all of them in make test.
SECOND_ORDER_RUNS = [
    pytest.param(case, mode, marks=[pytest.mark.slow] if slow else [])
    for case in CASES + OFFSET_CASES
    for mode in MODES
    for slow in [mode == "tpu-interpret" and case in (CASES[0], CASES[3])]
]


@pytest.mark.parametrize("case, mode", SECOND_ORDER_RUNS, ids=lambda x: str(x))
def test_second_order_kernels_match_autodiff_of_the_dense_passes(case, mode):
    """Along a random direction of all of (q, k, v, o, lse), as the rules' transposes take it."""
    primal, mask, d, g, dot = second_order_inputs(case)
    want = second_order_oracles(case, primal, mask, d, g, dot)
    got = second_order_kernels(primal, mask, d, g, dot, options(case, MODES[mode]))
    assert_matches(got, want, primal, 1e-5)
    rows = empty_rows(case).nonzero()
    assert np.all(np.asarray(got["tangent_jvp"][0])[rows[0], :, rows[1]] == 0)
    assert np.all(np.asarray(got["second_vjp"][0])[rows[0], :, rows[1]] == 0)


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=[] if c in CASES[1:3] else [pytest.mark.slow]) for c in CASES]
    + OFFSET_CASES,
    ids=str,
)
def test_second_order_kernels_are_second_derivatives_of_naive_attention(case):
    """At the forward's own (o, lse), moved with (q, k, v): tangent_jvp is the JVP of the JVP of
    naive attention, vjp_jvp the JVP of its VJP, second_vjp the VJP of its JVP."""
    p, t, g_o, g_lse, mask = inputs(case, seed=4)
    fn = oracle(case, mask)
    x = (p["q"], p["k"], p["v"])
    d = (t["q"], t["k"], t["v"])
    rng = np.random.default_rng(5)
    x_dot = tuple(jnp.asarray(rng.standard_normal(a.shape), a.dtype) for a in x)
    (o, lse), (o_dot, lse_dot) = jax.jvp(fn, x, x_dot)
    primal, dot = (*x, o, lse), (*x_dot, o_dot, lse_dot)
    opts = options(case, True)
    jvp_of_jvp = jax.jvp(lambda *a: jax.jvp(fn, a, d)[1], x, x_dot)[1]
    got = flash_tangent_jvp(*primal, mask, *d, *dot, **opts)
    for x_got, want in zip(got, jvp_of_jvp, strict=True):
        close(x_got, want, 1e-5)
    jvp_of_vjp = jax.jvp(lambda *a: jax.vjp(fn, *a)[1]((g_o, g_lse)), x, x_dot)[1]
    got = flash_vjp_jvp(*primal, mask, g_o, g_lse, *dot, **opts)
    for x_got, want in zip(got, jvp_of_vjp, strict=True):
        close(x_got, want, 1e-5)
    # the chain rule through (o, lse) = fn(q, k, v) turns second_vjp into the VJP of the JVP
    grads = flash_second_vjp(*primal, mask, *d, g_o, g_lse, **opts)
    _, pullback = jax.vjp(fn, *x)
    through = pullback((grads[3], grads[4]))
    vjp_of_jvp = jax.vjp(lambda *a: jax.jvp(fn, a, d)[1], *x)[1]((g_o, g_lse))
    for direct, chained, want in zip(grads[:3], through, vjp_of_jvp, strict=True):
        close(direct + chained, want, 1e-5)


@pytest.mark.parametrize("case", CASES[1:3] + OFFSET_CASES, ids=str)
def test_second_order_kernels_transpose_into_each_other(case):
    """<tangent_jvp(d, P_dot), g> = <P_dot, second_vjp(d, g)> = <vjp_jvp(g, P_dot), d>: the
    identities the rules' transposes rely on."""
    primal, mask, d, g, dot = second_order_inputs(case, seed=6)
    got = second_order_kernels(primal, mask, d, g, dot, options(case, True))
    pair = lambda a, b: sum(float(jnp.vdot(f32(x), f32(y))) for x, y in zip(a, b, strict=True))
    along_tangent = pair(got["tangent_jvp"], g)
    assert pair(dot, got["second_vjp"]) == pytest.approx(along_tangent, rel=1e-5)
    assert pair(got["vjp_jvp"], d) == pytest.approx(along_tangent, rel=1e-5)


@pytest.mark.parametrize("mode", MODES)
def test_second_order_kernels_in_bf16_match_the_float32_oracle(mode):
    case = CASES[1]
    primal, mask, d, g, dot = second_order_inputs(case, jnp.bfloat16, seed=7)
    want = second_order_oracles(case, primal, mask, d, g, dot)
    got = second_order_kernels(primal, mask, d, g, dot, options(case, MODES[mode]))
    assert_matches(got, want, primal, 3e-2)


# --- Block sizes ------------------------------------------------------------------------------

GENERATIONS = ("v4", "v5e", "v5p", "v6e", "7x")


@pytest.mark.parametrize("generation", [*GENERATIONS, None])
@pytest.mark.parametrize("itemsize", [2, 4])
@pytest.mark.parametrize("length", [1, 40, 127, 128, 200, 600, 1024, 4096, 5000])
def test_flash_blocks_are_aligned_and_pad_little(generation, itemsize, length):
    blocks = flash_blocks(length, length, 64, itemsize, generation)
    for block in (blocks.block_q, blocks.block_k):
        if length < 128:
            assert block >= length and block % (8 * (4 // itemsize)) == 0 and block <= 128
        else:
            assert block % 128 == 0
            padded = -(-length // block) * block
            assert padded - length < 128 * -(-length // block)  # under 128 rows per block
    target = flash_blocks(3072 * 1024, 3072 * 1024, 64, itemsize, generation)
    for block, most in ((blocks.block_q, target.block_q), (blocks.block_k, target.block_k)):
        assert block <= most and -(-length // block) * block <= -(-length // most) * most
    assert blocks.vmem_limit_bytes > 0


def test_flash_blocks_pad_less_than_the_generations_figure_would():
    """4,096 rows: TPU7x's figure 768 would pad them to 4,608 and v5p's 384 to 4,224; half the
    figure (about the ridge point) and up, the least padding is none."""
    assert flash_blocks(4096, 4096, 64, 2, "7x").block_q == 512
    assert flash_blocks(4096, 4096, 64, 2, "v5p").block_q == 256
    assert flash_blocks(4608, 4096, 64, 2, "7x").block_q == 768


def test_flash_blocks_per_generation():
    bf16 = {g: flash_blocks(3072, 3072, 64, 2, g) for g in GENERATIONS}
    assert {g: (b.block_q, b.block_k) for g, b in bf16.items()} == {
        "v4": (256, 512),
        "v5e": (512, 512),
        "v5p": (384, 512),
        "v6e": (1024, 512),
        "7x": (768, 512),
    }
    unknown = flash_blocks(4096, 4096, 64, 2, None)
    assert unknown == FlashBlocks(
        min(b.block_q for b in bf16.values()),
        min(b.block_k for b in bf16.values()),
        min(b.vmem_limit_bytes for b in bf16.values()),
    )
    assert flash_blocks(600, 100, 64, 2, "v5e") == FlashBlocks(
        384, 112, bf16["v5e"].vmem_limit_bytes
    )


# --- Ahead-of-time compilation for real TPUs (libtpu's compile-only client) -------------------


def _programs(blocks: FlashBlocks, t: int, causal: bool):
    b, h, d = 1, 2, 64
    s = jax.ShapeDtypeStruct
    tq, tk = _padded(t, blocks.block_q), _padded(t, blocks.block_k)
    q, kv = s((b, h, tq, d), jnp.bfloat16), s((b, h, tk, d), jnp.bfloat16)
    mask, rows = s((b, tk), jnp.int32), s((b, h, tq), jnp.float32)
    kw = dict(
        scale=0.125,
        causal=causal,
        block_q=blocks.block_q,
        block_k=blocks.block_k,
        vmem_limit_bytes=blocks.vmem_limit_bytes,
    )
    return {
        "forward": (functools.partial(flash_forward, **kw), (q, kv, kv, mask)),
        "tangent": (
            functools.partial(flash_tangent, **kw),
            (q, kv, kv, q, rows, mask, q, kv, kv),
        ),
        "vjp": (functools.partial(flash_vjp, **kw), (q, kv, kv, q, rows, mask, q, rows)),
        "tangent_jvp": (
            functools.partial(flash_tangent_jvp, **kw),
            (q, kv, kv, q, rows, mask, q, kv, kv, q, kv, kv, q, rows),
        ),
        "vjp_jvp": (
            functools.partial(flash_vjp_jvp, **kw),
            (q, kv, kv, q, rows, mask, q, rows, q, kv, kv, q, rows),
        ),
        "second_vjp": (
            functools.partial(flash_second_vjp, **kw),
            (q, kv, kv, q, rows, mask, q, kv, kv, q, rows),
        ),
    }


def _padded(t: int, block: int) -> int:
    return -(-t // block) * block


def _visited_fraction(blocks: FlashBlocks, tq: int, tk: int, causal: bool) -> float:
    bq, bk = blocks.block_q, blocks.block_k
    nq, nk = tq // bq, tk // bk
    if not causal:
        return 1.0
    return sum(min(nk, (i * bq + bq - 1) // bk + 1) for i in range(nq)) / (nq * nk)


# matmul flops per visited score, from the kernels' loops at D = Dv = 64 (both kernels of a pair)
FLOPS_PER_SCORE = {
    "forward": 2 * (64 + 64),
    "tangent": 2 * (3 * 64 + 2 * 64),
    "vjp": 2 * (7 * 64),
    "tangent_jvp": 2 * (7 * 64 + 3 * 64),
    "vjp_jvp": 2 * (10 * 64 + 5 * 64),
    "second_vjp": 2 * (10 * 64 + 5 * 64),
}
KERNEL_CALLS = {"vjp": 2, "vjp_jvp": 2, "second_vjp": 2}


def _estimated_flops(hlo_text: str) -> dict[str, list[int]]:
    """Each Mosaic call's declared flops, by kernel (the call's name less ``flash_`` and its
    numeric suffix)."""
    calls: dict[str, list[int]] = {}
    for line in hlo_text.splitlines():
        if 'custom_call_target="tpu_custom_call"' in line:
            name = re.match(r"\s*(?:ROOT )?%flash_(\w+?)(?:\.\d+)? = ", line)
            flops = re.search(r'"cost_estimate":\{"flops":"(\d+)"', line)
            assert name and flops, line[:200]
            calls.setdefault(name.group(1), []).append(int(flops.group(1)))
    return calls


@pytest.mark.aot
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("t", [1024, 4096])
@pytest.mark.parametrize("generation", GENERATIONS)
def test_attention_kernels_compile_for_tpu(generation, t, causal):
    """bf16, D = 64, B = 1, H = 2, T padded to the generation's blocks, every kernel in one
    program: each kernel's Mosaic calls are in it and declare the expected flops (forward
    2 B H Tq Tk (D + Dv) x the fraction of blocks visited, ...), and the program's cost analysis
    reports their sum (the VJP's delta adds a few elementwise flops)."""
    pytest.importorskip("libtpu")
    from fastgp._measure import compiled as cf

    blocks = flash_blocks(t, t, 64, 2, generation)
    programs = _programs(blocks, t, causal)
    every_kernel = lambda args: {kernel: fn(*args[kernel]) for kernel, (fn, _) in programs.items()}
    shapes = {kernel: args for kernel, (_, args) in programs.items()}
    compiled = cf.compile_for(cf.tpu_device(generation), every_kernel, shapes)
    calls = _estimated_flops(compiled.as_text())
    assert {kernel: len(flops) for kernel, flops in calls.items()} == {
        kernel: KERNEL_CALLS.get(kernel, 1) for kernel in FLOPS_PER_SCORE
    }
    tq, tk = _padded(t, blocks.block_q), _padded(t, blocks.block_k)
    scores = 2 * tq * tk * _visited_fraction(blocks, tq, tk, causal)
    for kernel, per_score in FLOPS_PER_SCORE.items():
        assert sum(calls[kernel]) == pytest.approx(scores * per_score, rel=1e-3), kernel
    total = scores * sum(FLOPS_PER_SCORE.values())
    assert compiled.cost_analysis()["flops"] == pytest.approx(total, rel=1e-3)
