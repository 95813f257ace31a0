"""Grouped-query and multi-query attention: k and v with K heads, K dividing q's H.

Oracles: ``jax.nn.dot_product_attention`` (JAX's own grouped-query attention) for the naive
path's grouping, and the naive path (its grouped einsum, no repetition) under nested autodiff for
every derivative of ``fastgp.attention``, on one device and with the tokens split.
"""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P
from test_attention import BACKENDS, RTOL, derivatives, rel_err
from test_sequence_parallel import (
    SEQ,
    collectives,
    explicit_derivatives,
    in_auto_jit,
    in_shard_map,
    placed,
    seq_mesh,
)

import fastgp


def grouped_inputs(b, tq, tk, heads, kv_heads, d, seed=0):
    """(q, k, v), a key mask with a key for every query, and tangents; k and v have kv_heads."""
    ks = jax.random.split(jax.random.PRNGKey(seed), 7)
    q = jax.random.normal(ks[0], (b, tq, heads, d))
    k = jax.random.normal(ks[1], (b, tk, kv_heads, d))
    v = jax.random.normal(ks[2], (b, tk, kv_heads, d))
    mask = (jax.random.uniform(ks[3], (b, tk)) > 0.3).at[:, 0].set(True)
    tangents = tuple(jax.random.normal(ks[4 + i], x.shape) for i, x in enumerate((q, k, v)))
    return (q, k, v), mask, tangents


# b, tq, tk, heads, kv_heads, d, causal
CASES = [
    (2, 37, 53, 4, 2, 32, False),  # two groups of two: a tiled (h % K) reading differs
    (1, 29, 29, 3, 1, 64, True),  # multi-query, causal
]


@pytest.mark.parametrize("causal", [False, True])
def test_the_naive_path_groups_heads_as_jax_does(causal):
    (q, k, v), _, _ = grouped_inputs(2, 24, 24, 6, 2, 16)
    want = jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="xla")
    got = fastgp.naive_attention(q, k, v, is_causal=causal)
    assert rel_err(got, want) < RTOL
    # and the grouping is not a tiling: head 1 reads key head 0, not key head 1
    tiled = jnp.tile(k, (1, 1, 3, 1)), jnp.tile(v, (1, 1, 3, 1))
    assert rel_err(fastgp.naive_attention(q, *tiled, is_causal=causal), want) > 0.1


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_every_derivative_matches_the_naive_grouped_attention(case, backend):
    b, tq, tk, heads, kv_heads, d, causal = case
    args, mask, tangents = grouped_inputs(b, tq, tk, heads, kv_heads, d)
    ours = lambda q, k, v: fastgp.attention(q, k, v, mask=mask, is_causal=causal, backend=backend)
    naive = lambda q, k, v: fastgp.naive_attention(q, k, v, mask=mask, is_causal=causal)
    got, want = derivatives(ours, args, tangents), derivatives(naive, args, tangents)
    for name in want:
        assert rel_err(got[name], want[name]) < RTOL, name
    assert [g.shape for g in got["vjp"]] == [x.shape for x in args]  # k's cotangent: K heads


@pytest.mark.parametrize(
    ("scheme", "heads", "kv_heads"),
    # the all-to-all trades 4 key heads over the 4 devices, or repeats 2 to 4 first
    [("ring", 2, 1), ("all-to-all", 8, 4), ("all-to-all", 4, 2), ("all-gather", 2, 1)],
)
def test_every_derivative_with_the_tokens_split(scheme, heads, kv_heads):
    args, mask, tangents = grouped_inputs(2, 64, 64, heads, kv_heads, 16)
    args, tangents = placed(seq_mesh(), SEQ, (args, tangents))
    ours = in_shard_map(mask, True, "xla", scheme=scheme)
    naive = lambda q, k, v: fastgp.naive_attention(q, k, v, mask=mask, is_causal=True)
    got, want = derivatives(ours, args, tangents), derivatives(naive, args, tangents)
    for name in want:
        assert rel_err(got[name], want[name]) < RTOL, name


def test_the_all_to_all_then_ring_takes_grouped_heads():
    """6 query and 2 key heads over a (2, 2) mesh: 6 heads do not split over 4 devices but do
    over the last axis's 2, whose all-to-all trades the 2 key heads; the ring runs over the
    first axis."""
    mesh = jax.make_mesh((2, 2), ("a", "b"), axis_types=(AxisType.Auto,) * 2)
    args, mask, tangents = grouped_inputs(2, 32, 32, 6, 2, 16)
    spec = P(None, ("a", "b"))

    def local(q, k, v, m):
        return fastgp.attention(q, k, v, mask=m, is_causal=True, sample_axis_name=("a", "b"))

    run = jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 4, out_specs=spec)
    ours = lambda q, k, v: run(q, k, v, mask)
    naive = lambda q, k, v: fastgp.naive_attention(q, k, v, mask=mask, is_causal=True)
    args, tangents = placed(mesh, spec, (args, tangents))
    got, want = derivatives(ours, args, tangents), derivatives(naive, args, tangents)
    for name in want:
        assert rel_err(got[name], want[name]) < RTOL, name
    assert {"all-to-all", "collective-permute"} <= set(collectives(ours, *args))


def traded_elements(kv_heads):
    """The elements the all-to-alls of a forward program move (8 query heads, 4 devices)."""
    q, k = jnp.ones((2, 64, 8, 16)), jnp.ones((2, 64, kv_heads, 16))
    local = lambda q, k, v: fastgp.attention(
        q, k, v, backend="xla", sample_axis_name="seq", sequence_parallel="all-to-all"
    )
    fn = jax.shard_map(local, mesh=seq_mesh(), in_specs=SEQ, out_specs=SEQ)
    text = jax.jit(fn).lower(q, k, k).compile().as_text() or ""
    results = [
        line.split(" = ")[1].split(" all-to-all(")[0]
        for line in text.splitlines()
        if " all-to-all(" in line
    ]
    assert results, "no all-to-all in the program"
    shapes = [re.findall(r"\[([\d,]+)\]", r) for r in results]
    return sum(math.prod(int(n) for n in dims.split(",")) for s in shapes for dims in s)


def test_the_all_to_all_trades_the_key_heads_that_split():
    """4 key heads over 4 devices travel as they are: q and o as with 8 heads, k and v at half;
    2 key heads do not split over 4 and are repeated first."""
    multi_head = traded_elements(8)
    assert traded_elements(4) == multi_head * (1 + 1 + 0.5 + 0.5) / 4  # q, o, k, v
    assert traded_elements(2) == multi_head


@pytest.mark.parametrize("scheme", ["ring", "all-to-all"])
@pytest.mark.parametrize("mode", ["explicit axes", "auto jit"])
def test_every_derivative_with_the_tokens_sharded_under_jit(mode, scheme):
    """The batch over "data" and the tokens over "seq" (explicit axes), or the tokens over "seq"
    (Auto jax.jit): the grouped k and v take the scheme as q does."""
    args, mask, tangents = grouped_inputs(2, 32, 32, 4, 2, 16)
    naive = lambda q, k, v: fastgp.naive_attention(q, k, v, mask=mask, is_causal=True)
    if mode == "auto jit":
        placed_args = placed(seq_mesh(), SEQ, (args, tangents))
        got = explicit_derivatives(in_auto_jit(mask, True, sequence_parallel=scheme), *placed_args)
    else:
        mesh = jax.make_mesh((2, 4), ("data", "seq"), axis_types=(AxisType.Explicit,) * 2)
        mask_in = jax.device_put(mask, NamedSharding(mesh, P("data", "seq")))
        ours = lambda q, k, v: fastgp.attention(
            q, k, v, mask=mask_in, is_causal=True, backend="xla", sequence_parallel=scheme
        )
        spec = P("data", "seq")
        with jax.set_mesh(mesh):
            got = explicit_derivatives(ours, placed(mesh, spec, args), placed(mesh, spec, tangents))
    want = explicit_derivatives(naive, args, tangents)
    for name in want:
        assert rel_err(got[name], want[name]) < RTOL, name


def test_heads_sharded_under_explicit_axes_keep_their_groups():
    """8 query heads and 4 key heads over the 4 devices of "seq": each device's key heads are
    those its query heads read, and every derivative set equals one device's."""
    args, mask, tangents = grouped_inputs(2, 32, 32, 8, 4, 16)
    mesh = jax.make_mesh((2, 4), ("data", "seq"), axis_types=(AxisType.Explicit,) * 2)
    mask_in = jax.device_put(mask, NamedSharding(mesh, P("data")))
    ours = lambda q, k, v: fastgp.attention(q, k, v, mask=mask_in, is_causal=True, backend="xla")
    spec = P("data", None, "seq")
    with jax.set_mesh(mesh):
        got = explicit_derivatives(ours, placed(mesh, spec, args), placed(mesh, spec, tangents))
    naive = lambda q, k, v: fastgp.naive_attention(q, k, v, mask=mask, is_causal=True)
    want = explicit_derivatives(naive, args, tangents)
    for name in want:
        assert rel_err(got[name], want[name]) < RTOL, name
    assert got["vjp"][1].sharding.spec == P("data", None, "seq", None)


def test_the_penalty_through_a_grouped_query_critic_equals_naive():
    """R1 through a one-layer critic with two query heads per key head: its value and parameter
    gradients (the penalty's second order) against the naive attention's."""
    (q0, k0, v0), _, _ = grouped_inputs(3, 16, 16, 4, 2, 8)
    params = {"q": q0[0, 0], "k": k0[0, 0], "v": v0[0, 0]}  # (4, 8), (2, 8), (2, 8)

    def critic(attention, params, x):  # x (B, T, 8)
        q = jnp.einsum("btd,hd->bthd", x, params["q"])
        k = jnp.einsum("btd,hd->bthd", x, params["k"])
        v = jnp.einsum("btd,hd->bthd", x, params["v"])
        return jnp.tanh(attention(q, k, v)).sum(axis=(1, 2, 3))

    x = jax.random.normal(jax.random.PRNGKey(5), (3, 16, 8))

    def loss(attention, params):
        return fastgp.gradient_penalty(lambda y: critic(attention, params, y), x, kind="r1")

    ours = jax.jit(jax.value_and_grad(lambda p: loss(fastgp.attention, p)))(params)
    naive = jax.value_and_grad(lambda p: loss(fastgp.naive_attention, p))(params)
    assert rel_err(ours, naive) < RTOL
    assert np.all(np.abs(np.asarray(ours[1]["k"])) > 0)


def test_heads_that_do_not_group_are_refused():
    q = jnp.ones((2, 8, 6, 16))
    with pytest.raises(ValueError, match=r"K dividing H \(grouped-query attention\)"):
        fastgp.attention(q, q[:, :, :4], q[:, :, :4])
    with pytest.raises(ValueError, match=r"k \(2, 8, 2, 16\), v \(2, 8, 3, 16\)"):
        fastgp.attention(q, q[:, :, :2], q[:, :, :3])
