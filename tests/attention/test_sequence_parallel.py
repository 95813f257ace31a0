"""Sequence-parallel fastgp.attention: the token axis split over 4 devices, against one device.

Every derivative set that test_attention.py checks on one device (value, JVP, VJP, both
Hessian-vector products, reverse-over-forward), with the tokens sharded inside shard_map
(``sample_axis_name``), under explicit axes and under Auto ``jax.jit``; causal masking with
several query blocks per shard; the kernels in interpret mode; the collectives of the compiled
program; and an exact R1 and WGAN-GP through a sequence-parallel transformer critic.
"""

import functools
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P
from test_attention import derivatives, inputs, rel_err

import fastgp
import oracles
from fastgp._attention import padded
from fastgp._attention.sequence import Scheme

# float32 stays (fastgp.attention accumulates in float32): the split tokens differ from one
# device by at most 7e-7 of the largest entry, derivative sets and the penalty through the critic
# alike, on AVX-512, SSE4.2 and AVX with one-threaded Eigen: 1e-5 leaves 14x.
RTOL = 1e-5
SEQ = P(None, "seq")


def seq_mesh():
    return jax.make_mesh((4,), ("seq",), axis_types=(AxisType.Auto,))


def in_shard_map(mask, causal, backend, check_vma=True, scheme="ring", layout="contiguous"):
    """(q, k, v) -> attention with the tokens split over "seq" inside shard_map, by ``scheme``;
    with the zigzag ``layout`` the tokens (and the mask) are put in its order before the split and
    the outputs back after, so the function is the same attention."""
    mesh = seq_mesh()
    zigzag = layout == "zigzag"
    order = (lambda x: fastgp.to_zigzag(x, 4)) if zigzag else (lambda x: x)
    restore = (lambda x: fastgp.from_zigzag(x, 4)) if zigzag else (lambda x: x)
    extra = () if mask is None else (order(mask),)

    def local(q, k, v, *m):
        return fastgp.attention(
            q,
            k,
            v,
            mask=m[0] if m else None,
            is_causal=causal,
            backend=backend,
            sample_axis_name="seq",
            sequence_parallel=scheme,
            sequence_layout=layout,
        )

    def fn(q, k, v):
        specs = (SEQ,) * (3 + len(extra))
        run = jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=SEQ, check_vma=check_vma)
        return restore(run(order(q), order(k), order(v), *extra))

    return fn


# (scheme, layout): the ring and the all-to-all in both layouts, and the all-gather
SPLITS = [
    ("ring", "contiguous"),
    ("ring", "zigzag"),
    ("all-gather", "contiguous"),
    ("all-to-all", "contiguous"),
    ("all-to-all", "zigzag"),
]


def heads_for(split, heads):
    """The all-to-all splits each device's heads over the 4 token shards: 4 heads for it."""
    return 4 if split[0] == "all-to-all" else heads


def naive(mask, causal):
    return lambda q, k, v: fastgp.naive_attention(q, k, v, mask=mask, is_causal=causal)


def placed(mesh, spec, tree):
    return jax.tree.map(lambda x: jax.device_put(x, NamedSharding(mesh, spec)), tree)


def assert_same_derivatives(ours, theirs, args, tangents):
    got, want = derivatives(ours, args, tangents), derivatives(theirs, args, tangents)
    for name in want:
        assert rel_err(got[name], want[name]) < RTOL, name


def assert_same_first_order(ours, oracle, args, tangents):
    """Value, VJP and JVP (the lighter check, for the larger or more numerous cases)."""
    assert rel_err(jax.jit(ours)(*args), oracle(*args)) < RTOL
    ct = jnp.cos(oracle(*args))
    got = jax.jit(lambda *a: jax.vjp(ours, *a)[1](ct))(*args)
    assert rel_err(got, jax.vjp(oracle, *args)[1](ct)) < RTOL
    got = jax.jit(lambda *a: jax.jvp(ours, a, tangents)[1])(*args)
    assert rel_err(got, jax.jvp(oracle, args, tangents)[1]) < RTOL


CASES = [
    # b, t, h, d, causal, padding
    (2, 64, 2, 16, False, True),
    (1, 64, 1, 32, True, True),
]


@pytest.mark.parametrize("split", SPLITS, ids=str)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_every_derivative_with_the_tokens_split_in_shard_map(case, split):
    b, t, h, d, causal, padding = case
    args, mask, tangents = inputs(b, t, t, heads_for(split, h), d, padding=padding)
    args, tangents = placed(seq_mesh(), SEQ, (args, tangents))
    ours = in_shard_map(mask, causal, "xla", scheme=split[0], layout=split[1])
    assert_same_derivatives(ours, naive(mask, causal), args, tangents)


@pytest.mark.parametrize("split", SPLITS, ids=str)
def test_causal_with_several_query_blocks_per_shard(split):
    """520 queries a shard: two blocks of the XLA loop (the zigzag's chunks of 260: one block
    each), each shard at its own causal offset (the all-to-all: 2,080 queries a device, in
    order)."""
    args, mask, tangents = inputs(1, 4 * 520, 4 * 520, heads_for(split, 1), 8, padding=True)
    args, tangents = placed(seq_mesh(), SEQ, (args, tangents))
    fn, oracle = (
        in_shard_map(mask, True, "xla", scheme=split[0], layout=split[1]),
        naive(mask, True),
    )
    assert_same_first_order(fn, oracle, args, tangents)


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_queries_without_a_visible_key_on_the_ring(layout):
    """The first 12 keys of the sequence masked out and causal: the first queries see no key at
    all (zeros, as on one device), others see keys of one device's block only, and a whole block
    hides every key from the queries it reaches (the online softmax must skip it, not average in
    its zeros). 6 tokens a chunk, so the zigzag's chunks are padded to 8."""
    args, _, tangents = inputs(2, 48, 48, 2, 8)
    mask = jnp.ones((2, 48), bool).at[:, :12].set(False)
    args, tangents = placed(seq_mesh(), SEQ, (args, tangents))
    fn, oracle = in_shard_map(mask, True, "xla", layout=layout), naive(mask, True)
    assert_same_first_order(fn, oracle, args, tangents)


@pytest.mark.parametrize(
    "case, backend, split",
    [
        (CASES[0], "interpret", SPLITS[2]),
        (CASES[1], "interpret", SPLITS[2]),  # causal: the all-gather's offsets
        (CASES[1], "gpu-interpret", SPLITS[2]),
        (CASES[1], "interpret", SPLITS[4]),  # causal: every token of a device's heads
    ],
    ids=str,
)
def test_the_kernels_with_the_tokens_split(case, backend, split):
    """Interpret-mode kernels per shard (the TPU family's and the Triton ones), at each shard's
    causal offset (all-gather), on each ring step's block, or on the whole sequence in order
    (the all-to-all from the zigzag). Generic interpret mode cannot carry manual axis types
    (JAX 0.10.2), so this shard_map runs with check_vma=False."""
    b, t, h, d, causal, padding = case
    args, mask, tangents = inputs(b, t, t, heads_for(split, h), d, padding=padding)
    args, tangents = placed(seq_mesh(), SEQ, (args, tangents))
    ours = in_shard_map(mask, causal, backend, False, *split)
    assert_same_derivatives(ours, naive(mask, causal), args, tangents)


@pytest.mark.parametrize(
    "backend, split",
    # the TPU family on the contiguous ring, the Triton kernels on the zigzag's (each step's
    # kernel call is the same one-device call in either layout), both with the gather
    [("interpret", s) for s in (SPLITS[0], SPLITS[2])]
    + [("gpu-interpret", s) for s in SPLITS[1:3]],
    ids=str,
)
def test_the_kernels_with_several_blocks_per_shard(backend, split, monkeypatch):
    """128 queries a shard in blocks of 64 (the GPU kernels' own; the TPU family's forced down
    from its 128-row minimum): each shard's two query blocks at causal offset 384 among eight key
    blocks (all-gather), or two blocks a ring step (the zigzag: one a chunk), the keys padded,
    every derivative against one device's naive attention."""
    monkeypatch.setattr(padded, "_blocks", lambda backend, tq, tk, d, itemsize: (64, 64))
    args, mask, tangents = inputs(1, 4 * 128, 4 * 128, 1, 16, padding=True)
    args, tangents = placed(seq_mesh(), SEQ, (args, tangents))
    ours = in_shard_map(mask, True, backend, False, *split)
    assert_same_derivatives(ours, naive(mask, True), args, tangents)


EXPLICIT = {"batch x tokens": P("data", "seq"), "batch x heads": P("data", None, "seq")}


@pytest.mark.parametrize(
    "split, backend, scheme",
    [(s, "xla", "ring") for s in sorted(EXPLICIT)]
    # the interpret kernels on the ring are held in shard_map above; here with the gather
    + [(s, "interpret", "all-gather") for s in sorted(EXPLICIT)]
    + [("batch x tokens", "xla", "all-to-all")],
    ids=str,
)
@pytest.mark.parametrize("causal", [False, True])
def test_explicit_axes(causal, split, backend, scheme: Scheme):
    """jax.jit under explicit axes, the batch over "data" and the tokens (or the heads) over
    "seq": the arrays' types say how they are split; no axis name is passed. The kernels run per
    device in a shard_map fastgp builds."""
    args, mask, tangents = inputs(2, 32, 32, 4, 16, padding=True)
    mesh = jax.make_mesh((2, 4), ("data", "seq"), axis_types=(AxisType.Explicit,) * 2)
    spec = EXPLICIT[split]
    mask_in = jax.device_put(mask, NamedSharding(mesh, P(*spec[:2])))
    ours = lambda q, k, v: fastgp.attention(
        q, k, v, mask=mask_in, is_causal=causal, backend=backend, sequence_parallel=scheme
    )
    with jax.set_mesh(mesh):
        got = explicit_derivatives(ours, placed(mesh, spec, args), placed(mesh, spec, tangents))
    want = explicit_derivatives(naive(mask, causal), args, tangents)
    for name in want:
        assert rel_err(got[name], want[name]) < RTOL, name


@functools.partial(jax.jit, static_argnums=0)
def explicit_derivatives(fn, args, tangents):
    """test_attention's derivative set, its inner products spelled as sums of products (under
    explicit axes a contraction over sharded axes needs an output sharding)."""
    loss = lambda *a: jnp.sum(jnp.sin(fn(*a)))
    grad = jax.grad(loss, argnums=(0, 1, 2))
    dot = lambda xs, ys: sum(jnp.sum(x * y) for x, y in zip(xs, ys, strict=True))
    return {
        "value": fn(*args),
        "jvp": jax.jvp(fn, args, tangents)[1],
        "vjp": jax.vjp(fn, *args)[1](jnp.cos(fn(*args))),
        "hvp forward-over-reverse": jax.jvp(grad, args, tangents)[1],
        "hvp reverse-over-reverse": jax.grad(lambda *a: dot(grad(*a), tangents), argnums=(0, 1, 2))(
            *args
        ),
        "reverse-over-forward": jax.grad(
            lambda *a: jnp.sum(jnp.sin(jax.jvp(fn, a, tangents)[1])), argnums=(0, 1, 2)
        )(*args),
    }


def collectives(fn, *args):
    """{kind: the lines of that collective} in ``fn``'s compiled program."""
    text = jax.jit(fn).lower(*args).compile().as_text() or ""
    kinds = ("all-gather", "all-reduce", "reduce-scatter", "collective-permute", "all-to-all")
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        for kind in kinds:
            if f" {kind}(" in line or f" {kind}-start(" in line:
                found.setdefault(kind, []).append(line)
    return found


def in_auto_jit(mask, causal, **split):
    """(q, k, v) -> attention as a plain jax.jit sees it: the inputs' shardings say the rest."""
    return lambda q, k, v: fastgp.attention(
        q, k, v, mask=mask, is_causal=causal, backend="xla", **split
    )


@pytest.mark.parametrize("case", CASES + [(2, 64, 4, 16, True, True)], ids=str)
def test_every_derivative_with_the_tokens_split_under_auto_jit(case):
    """Auto jax.jit, the tokens sharded over "seq" and nothing else said: fastgp partitions each
    pass itself (the ring, or with 4 heads the all-to-all), and every derivative set equals one
    device's."""
    b, t, h, d, causal, padding = case
    args, mask, tangents = inputs(b, t, t, h, d, padding=padding)
    args, tangents = placed(seq_mesh(), SEQ, (args, tangents))
    assert_same_derivatives(in_auto_jit(mask, causal), naive(mask, causal), args, tangents)


@pytest.mark.parametrize(
    "layout",
    [
        (2, 96, 64, 4, P("data", "seq", None)),  # cross attention, T_q != T_k
        (1, 128, 128, 4, P(None, ("data", "seq"), None)),  # the tokens over two mesh axes
        (1, 64, 64, 4, P(None, "seq", "data")),  # heads split too
    ],
    ids=str,
)
def test_auto_jit_on_other_meshes(layout):
    """The ring under Auto jax.jit on a (2, 4) mesh: beside the batch, over both axes, beside
    the heads; value, VJP and JVP against one device, collective-permutes and no all-gather."""
    b, tq, tk, h, spec = layout
    mesh = jax.make_mesh((2, 4), ("data", "seq"), axis_types=(AxisType.Auto,) * 2)
    (q, k, v), mask, (dq, dk, dv) = inputs(b, tq, tk, h, 8, padding=True)
    causal = tq == tk
    fn = in_auto_jit(mask, causal, sequence_parallel="ring")
    q, dq = placed(mesh, spec, (q, dq))
    k, v, dk, dv = placed(mesh, spec, (k, v, dk, dv))
    assert_same_first_order(fn, naive(mask, causal), (q, k, v), (dq, dk, dv))
    found = collectives(lambda *a: jax.vjp(fn, *a)[1](jnp.ones(q.shape)), q, k, v)
    assert "collective-permute" in found and "all-gather" not in found, sorted(found)


@pytest.mark.parametrize(
    "layout",
    [
        (2, 96, 64, 4, P("data", "seq", None), False),  # cross attention beside the batch
        (2, 64, 64, 8, P(None, "seq", "data"), True),  # heads split too: 4 a device over 4
        (2, 64, 64, 4, P("data", "seq"), True),  # batch x tokens, causal
    ],
    ids=str,
)
def test_auto_jit_all_to_all_on_other_meshes(layout):
    """The all-to-all ("auto" takes it) under Auto jax.jit on a (2, 4) mesh: value, VJP and JVP
    against one device; all-to-alls, no collective-permute."""
    b, tq, tk, h, spec, causal = layout
    mesh = jax.make_mesh((2, 4), ("data", "seq"), axis_types=(AxisType.Auto,) * 2)
    (q, k, v), mask, (dq, dk, dv) = inputs(b, tq, tk, h, 8, padding=True)
    fn = in_auto_jit(mask, causal)
    q, k, v, dq, dk, dv = placed(mesh, spec, (q, k, v, dq, dk, dv))
    assert_same_first_order(fn, naive(mask, causal), (q, k, v), (dq, dk, dv))
    found = collectives(lambda *a: jax.vjp(fn, *a)[1](jnp.ones(q.shape)), q, k, v)
    assert "all-to-all" in found and "collective-permute" not in found, sorted(found)


def test_auto_jit_gathers_tokens_that_do_not_split_into_blocks():
    """26 tokens a device (no block of a multiple of 8 tiles them), or sequence_parallel=
    "all-gather": XLA's partitioner gathers the tokens instead of the ring, still exact."""
    args, mask, tangents = inputs(1, 104, 104, 2, 8, padding=True)
    args, tangents = placed(seq_mesh(), SEQ, (args, tangents))
    for fn in (in_auto_jit(mask, True), in_auto_jit(mask, True, sequence_parallel="all-gather")):
        assert_same_first_order(fn, naive(mask, True), args, tangents)
        assert "collective-permute" not in collectives(fn, *args)
    args = placed(seq_mesh(), SEQ, inputs(1, 64, 64, 2, 8)[0])
    assert "collective-permute" in collectives(in_auto_jit(None, True), *args)
    gather = in_auto_jit(None, True, sequence_parallel="all-gather")
    assert "collective-permute" not in collectives(gather, *args)


def test_an_exported_auto_jit_program_leaves_the_tokens_to_the_partitioner():
    """jax.export cannot carry a partitioning callback: an exported program holds no custom
    partitioning call and runs, exact, where it is called."""
    args, mask, _ = inputs(1, 64, 64, 2, 8, padding=True)
    args = placed(seq_mesh(), SEQ, args)
    fn = jax.jit(in_auto_jit(mask, True))
    exported = jax.export.export(fn)(*args)
    assert "CustomSPMDPartitioning" not in exported.mlir_module()
    assert rel_err(exported.call(*args), naive(mask, True)(*args)) < RTOL


@pytest.mark.parametrize("mode", ["shard_map", "auto jit"])
def test_the_ring_programs_pass_blocks_and_gather_nothing(mode):
    """The ring's forward, VJP and the R1-style reverse-over-forward program, in shard_map and
    under Auto jax.jit: collective-permutes only (the blocks, and in the VJP their g_k and g_v
    sums), no all-gather of the tokens."""
    args, mask, tangents = inputs(2, 64, 64, 2, 16, padding=True)
    args, tangents = placed(seq_mesh(), SEQ, (args, tangents))
    fn = in_shard_map(mask, True, "xla") if mode == "shard_map" else in_auto_jit(mask, True)
    ct = jnp.ones((2, 64, 2, 16))
    programs = {
        "forward": fn,
        "vjp": lambda *a: jax.vjp(fn, *a)[1](ct),
        "reverse-over-forward": jax.grad(
            lambda *a: jnp.sum(jax.jvp(fn, a, tangents)[1] ** 2), argnums=(0, 1, 2)
        ),
    }
    for name, program in programs.items():
        found = collectives(program, *args)
        assert set(found) == {"collective-permute"}, (name, sorted(found))
        # each on a channel of its own: XLA:CPU joins concurrent permutes of one channel into one
        # rendezvous, which aborts (tests/penalty/test_layouts.py's explicit sequence-parallel
        # case did, before); under Auto jit each pass's body is lowered apart
        channels = re.findall(r"channel_id=(\d+)", "\n".join(found["collective-permute"]))
        assert len(set(channels)) == len(channels), (name, channels)


# Tokens over several mesh axes whose devices together do not divide the heads: "auto" trades
# the last axes the heads allow for a head split and runs the ring over the others.
MULTI_AXIS = {
    "ring 2 x all-to-all 2": ((2, 2), 2),  # (mesh shape over the token axes, heads)
    "ring 2 x 2 x all-to-all 2": ((2, 2, 2), 2),  # the ring over two mesh axes
    "ring 2 x all-to-all 4": ((2, 4), 4),
}


def multi_axis(name, mask, causal, explicit=False):
    """(attention with the tokens over every axis of MULTI_AXIS[name]'s mesh, the mesh, the
    token spec, heads)."""
    shape, heads = MULTI_AXIS[name]
    names = ("a", "b", "c")[: len(shape)]
    types = (AxisType.Explicit if explicit else AxisType.Auto,) * len(shape)
    mesh = jax.make_mesh(shape, names, axis_types=types)
    spec = P(None, names)
    if explicit:
        mask_in = jax.device_put(mask, NamedSharding(mesh, spec))
        fn = lambda q, k, v: fastgp.attention(q, k, v, mask=mask_in, is_causal=causal)
        return fn, mesh, spec, heads

    def local(q, k, v, m):
        return fastgp.attention(q, k, v, mask=m, is_causal=causal, sample_axis_name=names)

    run = jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 4, out_specs=spec)
    return (lambda q, k, v: run(q, k, v, mask)), mesh, spec, heads


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", sorted(MULTI_AXIS))
def test_all_to_all_then_ring_over_several_token_axes(name, causal):
    """Every derivative set against one device, in shard_map; the program holds all-to-alls and
    collective-permutes and gathers nothing but the key mask."""
    args, mask, tangents = inputs(2, 64, 64, MULTI_AXIS[name][1], 16, padding=True)
    fn, mesh, spec, _ = multi_axis(name, mask, causal)
    args, tangents = placed(mesh, spec, (args, tangents))
    assert_same_derivatives(fn, naive(mask, causal), args, tangents)
    found = collectives(jax.grad(lambda *a: jnp.sum(fn(*a) ** 2), argnums=(0, 1, 2)), *args)
    assert {"all-to-all", "collective-permute"} <= set(found), sorted(found)
    assert all("pred[" in line for line in found.get("all-gather", [])), found["all-gather"]


def test_all_to_all_then_ring_under_explicit_axes():
    args, mask, tangents = inputs(2, 64, 64, 2, 16, padding=True)
    fn, mesh, spec, _ = multi_axis("ring 2 x 2 x all-to-all 2", mask, True, explicit=True)
    with jax.set_mesh(mesh):
        got = explicit_derivatives(fn, placed(mesh, spec, args), placed(mesh, spec, tangents))
    want = explicit_derivatives(naive(mask, True), args, tangents)
    for name in want:
        assert rel_err(got[name], want[name]) < RTOL, name


@pytest.mark.aot
def test_the_ring_sends_each_block_while_a_kernel_runs_on_tpu():
    """Compiled for v5e (4 chips, the tokens split over all): in XLA:TPU's schedule every block
    and every key-side sum is sent inside the step loops (the own block's step and the hop home
    of the key-side sums included), each in flight while a Mosaic kernel runs. A ring whose send
    waited on the step's kernel (or whose kernel waited on the send) fails here, as does one with
    a transfer outside its loops or any transfer exposed."""
    from benchmarks.attention.ring_overlap import PROGRAMS, overlap
    from benchmarks.attention.sequence_memory import tpu_compiled

    found = {
        name: overlap(compiled.as_text())
        for name, compiled in tpu_compiled("v5e:2x2", 8192, 4, "ring", PROGRAMS).items()
    }
    loops = found["gradient"]["loops"]
    assert loops["kernel"] >= 6 and loops["fusions"] == loops["exposed"] == 0, found
    for name, counts in found.items():
        assert counts["loops"]["exposed"] == 0 and counts["outside"]["kernel"] == 0, (name, counts)
        assert counts["outside"]["fusions"] == counts["outside"]["exposed"] == 0, (name, counts)


@pytest.mark.parametrize("program", ["gradient", "reverse-over-forward"])
def test_memory_per_device_falls_with_the_shards(program):
    """Compiled temporaries per device over one device's, 4,096 tokens of 8 heads of 64 (XLA's
    memory analysis; docs/performance.md's table, `--heads 8`): the all-to-all holds 1 / n of one
    device's, the ring less than 3 / n at n = 4 (0.62 and 0.68 measured) and falls with n (0.31
    and 0.43 at n = 8). A scheme that gathered the keys and values, or a ring that kept every
    block it saw, holds 0.9x or more and does not fall."""
    from benchmarks.attention.sequence_memory import measure, programs, sharded_attention

    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    args = [jax.random.normal(key, (2, 4096, 8, 64)) for key in keys]
    one = programs(lambda *a: fastgp.attention(*a, backend="xla"))[program]
    one_temp = measure(one, *args, repeats=0)["temp"]

    def of_one(n, scheme):
        fn, (mesh, spec) = sharded_attention(n, "shard_map", scheme)
        placed_args = [jax.device_put(x, NamedSharding(mesh, spec)) for x in args]
        return measure(programs(fn)[program], *placed_args, repeats=0)["temp"] / one_temp

    assert of_one(4, "all-to-all") <= 1.01 / 4
    ring_4, ring_8 = of_one(4, "ring"), of_one(8, "ring")
    assert ring_4 < 3 / 4 and ring_8 < 0.7 * ring_4, (ring_4, ring_8)


def test_the_all_gather_gathers_only_keys_values_and_the_mask():
    """The forward gathers k, v and the key mask (3 all-gathers); the VJP adds none: each
    device's g_k and g_v parts are reduce-scattered back to their shards."""
    args, mask, _ = inputs(2, 64, 64, 2, 16, padding=True)
    args = placed(seq_mesh(), SEQ, args)
    fn = in_shard_map(mask, True, "xla", scheme="all-gather")
    assert len(collectives(fn, *args)["all-gather"]) == 3
    ct = jnp.ones((2, 64, 2, 16))
    found = collectives(lambda *a: jax.vjp(fn, *a)[1](ct), *args)
    assert len(found["all-gather"]) == 3, found["all-gather"]
    assert "reduce-scatter" in found or "all-reduce" in found


def test_the_all_to_all_trades_tokens_for_heads_and_gathers_only_the_mask():
    """The all-to-all's forward: q, k and v to heads and the output back (4 all-to-alls), the
    key mask gathered (1 all-gather, of booleans); its VJP's only gather is the mask's. Under
    Auto jax.jit too ("auto" takes it: 4 heads over 4 devices), with the tokens over two mesh
    axes too (8 heads over 8 devices); where the heads do not split
    over the token shards (4 over 8), "auto" runs the ring and "all-to-all" is refused."""
    args, mask, _ = inputs(2, 64, 64, 4, 16, padding=True)
    args = placed(seq_mesh(), SEQ, args)
    fn = in_shard_map(mask, True, "xla", scheme="all-to-all")
    found = collectives(fn, *args)
    assert len(found["all-to-all"]) == 4 and "collective-permute" not in found, sorted(found)
    assert [" pred[" in line for line in found["all-gather"]] == [True], found["all-gather"]
    ct = jnp.ones((2, 64, 4, 16))
    found = collectives(lambda *a: jax.vjp(fn, *a)[1](ct), *args)
    assert len(found["all-to-all"]) >= 7, len(found["all-to-all"])  # 4 there and 3 back (or 4)
    assert all(" pred[" in line for line in found["all-gather"]), found["all-gather"]
    auto = in_auto_jit(mask, True)
    found = collectives(lambda *a: jax.vjp(auto, *a)[1](ct), *args)
    assert "all-to-all" in found and "collective-permute" not in found, sorted(found)
    assert all(" pred[" in line for line in found.get("all-gather", [])), found["all-gather"]
    mesh = jax.make_mesh((2, 4), ("data", "seq"), axis_types=(AxisType.Auto,) * 2)
    for heads, scheme, kind in [(8, "all-to-all", "all-to-all"), (4, "auto", "ring")]:
        (q, k, v), mask, (dq, dk, dv) = inputs(1, 128, 128, heads, 8, padding=True)
        fn = in_auto_jit(mask, True, sequence_parallel=scheme)
        spec = P(None, ("data", "seq"))
        args, tangents = placed(mesh, spec, ((q, k, v), (dq, dk, dv)))
        assert_same_first_order(fn, naive(mask, True), args, tangents)
        found = collectives(fn, *args)
        assert ("all-to-all" in found) == (kind == "all-to-all"), (heads, sorted(found))
        assert ("collective-permute" in found) == (kind == "ring"), (heads, sorted(found))
    with pytest.raises(Exception, match="q has 4 heads on each device, not a multiple of 8"):
        jax.jit(in_auto_jit(mask, True, **ALL_TO_ALL))(*args)


def test_auto_jit_trades_each_array_once():
    """Under Auto jax.jit each pass takes its operands on the head split and XLA's partitioner
    trades them there, once for each array however many passes read it; a pass trades only its
    results back. The gradient program: q, k, v there, the output o and its lse back with the
    forward's result and there again for the VJP, g_o there, dq, dk, dv back: 11 (shard_map
    keeps o and lse on the heads: 8). Reverse over forward (R1's program): 25, against 11 (a
    trade of every operand inside each pass made 15 and 43)."""
    (q, k, v), _, _ = inputs(2, 64, 64, 4, 16)
    args = placed(seq_mesh(), SEQ, (q, k, v))
    attention = in_auto_jit(None, False)
    loss = lambda *a: jnp.sum(attention(*a) ** 2)
    r1 = lambda *a: jnp.sum(jax.jvp(attention, a, a)[1] ** 2)
    for program, trades in ((loss, 11), (r1, 25)):
        found = collectives(jax.grad(program, argnums=(0, 1, 2)), *args)
        assert set(found) == {"all-to-all"}, sorted(found)
        assert len(found["all-to-all"]) == trades, len(found["all-to-all"])


ALL_TO_ALL = {"sequence_parallel": "all-to-all"}


def test_refusals_name_the_problem():
    args, _, _ = inputs(1, 16, 16, 1, 8)
    mesh = seq_mesh()
    replicated_k = lambda q, k, v: fastgp.attention(q, k, v, sample_axis_name="seq")
    run = jax.shard_map(replicated_k, mesh=mesh, in_specs=(SEQ, P(), P()), out_specs=SEQ)
    with pytest.raises(ValueError, match="k is the same on every device"):
        jax.jit(run)(*args)
    for scheme in ("ring", "all-gather"):
        kernel = lambda q, k, v, scheme=scheme: fastgp.attention(
            q, k, v, backend="interpret", sample_axis_name="seq", sequence_parallel=scheme
        )
        run = jax.shard_map(kernel, mesh=mesh, in_specs=(SEQ,) * 3, out_specs=SEQ)
        with pytest.raises(ValueError, match=r"fastgp\.attention.*check_vma=False"):
            jax.jit(run)(*placed(mesh, SEQ, args))
    split = lambda scheme, layout, t=16: jax.shard_map(
        lambda q, k, v: fastgp.attention(
            q,
            k,
            v,
            is_causal=True,
            sample_axis_name="seq",
            sequence_parallel=scheme,
            sequence_layout=layout,
        ),
        mesh=mesh,
        in_specs=(SEQ,) * 3,
        out_specs=SEQ,
    )
    placed_args = placed(mesh, SEQ, args)
    with pytest.raises(ValueError, match="sequence_parallel='rings' is not one of"):
        jax.jit(split("rings", "contiguous"))(*placed_args)
    with pytest.raises(ValueError, match="sequence_layout='zig-zag' is not one of"):
        jax.jit(split("ring", "zig-zag"))(*placed_args)
    with pytest.raises(ValueError, match="zigzag' runs on the ring"):
        jax.jit(split("all-gather", "zigzag"))(*placed_args)
    with pytest.raises(ValueError, match="zigzag' says how each device holds its tokens"):
        jax.jit(in_auto_jit(None, True, sequence_layout="zigzag"))(*placed_args)
    with pytest.raises(ValueError, match="sequence_parallel='rings' is not one of"):
        jax.jit(in_auto_jit(None, True, sequence_parallel="rings"))(*placed_args)
    heads_refused = "q has 1 heads on each device, not a multiple of 4"
    with pytest.raises(ValueError, match=heads_refused):
        jax.jit(split("all-to-all", "contiguous"))(*placed_args)
    # Under Auto jit, one answer too: refused, never another scheme run in its place. XLA's
    # partitioner calls the check while it compiles, so JAX wraps the ValueError in its own
    # runtime error, whose text is the same message.
    with pytest.raises(Exception, match=rf"ValueError: fastgp\.attention.*{heads_refused}"):
        jax.jit(in_auto_jit(None, True, **ALL_TO_ALL))(*placed_args)
    jax.jit(in_auto_jit(None, True))(*placed_args)  # "auto" takes the ring there
    odd, _, _ = inputs(1, 12, 12, 1, 8)  # 3 tokens a device
    with pytest.raises(ValueError, match="token count must be even, got 3"):
        jax.jit(split("ring", "zigzag"))(*placed(mesh, SEQ, odd))
    with pytest.raises(ValueError, match="multiple of 8"):
        fastgp.to_zigzag(args[0], 4)  # 16 tokens in 8 chunks: fine
        fastgp.to_zigzag(odd[0], 4)


# --- The penalty through a sequence-parallel transformer critic ---------------------------------

T, C, WIDTH, HEADS = 32, 3, 16, 2


def critic_params(heads=HEADS):
    """2 heads over 4 devices: attention's "auto" runs the ring; 4 heads: the all-to-all."""
    ks = jax.random.split(jax.random.PRNGKey(11), 5)
    return {
        "embed": jax.random.normal(ks[0], (C, WIDTH)) * 0.5,
        "pos": jax.random.normal(ks[1], (T, WIDTH)) * 0.2,
        "qkv": jax.random.normal(ks[2], (WIDTH, 3, heads, WIDTH // heads)) * 0.3,
        "out": jax.random.normal(ks[3], (heads, WIDTH // heads, WIDTH)) * 0.3,
        "head": jax.random.normal(ks[4], (WIDTH,)),
    }


def transformer_critic(params, x, seq_axis=None):
    """Tokens (B, T_local, C) -> one pre-LN attention block -> mean over every token -> score."""
    t_local = x.shape[1]
    start = 0 if seq_axis is None else lax.axis_index(seq_axis) * t_local
    h = x @ params["embed"] + lax.dynamic_slice_in_dim(params["pos"], start, t_local)
    normed = (h - h.mean(-1, keepdims=True)) / jnp.sqrt(h.var(-1, keepdims=True) + 1e-5)
    q, k, v = (jnp.einsum("btc,chd->bthd", normed, params["qkv"][:, i]) for i in range(3))
    o = fastgp.attention(q, k, v, is_causal=True, sample_axis_name=seq_axis)
    h = h + jnp.einsum("bthd,hdc->btc", o, params["out"])
    pooled = jnp.sum(h, axis=1)
    if seq_axis is not None:
        pooled = lax.psum(pooled, seq_axis)
    return jnp.tanh(pooled / T) @ params["head"]


def tokens():
    """Four samples of T tokens."""
    return jax.random.normal(jax.random.PRNGKey(12), (4, T, C))


def value_grad_hvp(loss, params):
    """The loss, its parameter gradients and its HVP along a fixed tangent."""
    tangent = jax.tree.map(lambda a: jnp.sin(jnp.arange(a.size).reshape(a.shape)), params)
    return oracles.value_grad_hvp(loss, params, tangent)


@functools.cache
def naive_value_grad_hvp(kind, heads=HEADS):
    """The one-device oracle of the sequence-parallel critic's penalty, once per kind and head
    count."""

    def oracle(params, x):
        return value_grad_hvp(
            lambda p: fastgp.naive_gradient_penalty(
                lambda y: transformer_critic(p, y), x, kind=kind
            ),
            params,
        )

    return jax.jit(oracle)(critic_params(heads), tokens())


# R1 differs from WGAN-GP only in the penalty of each norm, which the penalty's own
# sample-axis tests hold; its cases run in make test, WGAN-GP's in make check too.
@pytest.mark.parametrize("heads", [HEADS, 4], ids=["ring", "all-to-all"])
@pytest.mark.parametrize("second_order", ["reverse-over-forward", "reverse"])
@pytest.mark.parametrize("kind", [pytest.param("r1", marks=pytest.mark.slow), "wgan-gp"])
def test_exact_penalty_through_a_sequence_parallel_transformer_critic(kind, second_order, heads):
    params = critic_params(heads)
    mesh = jax.make_mesh((2, 4), ("data", "seq"), axis_types=(AxisType.Auto,) * 2)

    def step(params, x):
        return value_grad_hvp(
            lambda p: fastgp.gradient_penalty(
                lambda y: transformer_critic(p, y, "seq"),
                x,
                kind=kind,
                axis_name="data",
                sample_axis_name="seq",
                second_order=second_order,
            ),
            params,
        )

    run = jax.shard_map(step, mesh=mesh, in_specs=(P(), P("data", "seq")), out_specs=P())
    got = jax.jit(run)(placed(mesh, P(), params), placed(mesh, P("data", "seq"), tokens()))
    want = naive_value_grad_hvp(kind, heads)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        scale = float(np.max(np.abs(w)))
        assert float(np.max(np.abs(np.asarray(g) - np.asarray(w)))) <= RTOL * scale


@pytest.mark.slow
def test_two_processes_of_four_devices_equal_one_device(tmp_path):
    """Real jax.distributed processes (gloo on 127.0.0.1), in each layout of the worker's
    LAYOUTS: the batch across the two and the tokens within each (the ring), and each sample's
    tokens across both (the ring, and with 4 heads the all-to-all, trading between processes);
    R1 and its parameter gradients equal one device's."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    worker = Path(__file__).with_name("sequence_worker.py")
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
    # files, not pipes: a worker blocked on a full pipe that nobody reads would hold the other
    # at jax.distributed's shutdown barrier
    logs = [(tmp_path / f"out{i}", tmp_path / f"err{i}") for i in range(2)]
    procs = []
    for i, (out, err) in enumerate(logs):
        with out.open("w") as stdout, err.open("w") as stderr:
            command = [sys.executable, str(worker), str(i), port]
            procs.append(subprocess.Popen(command, stdout=stdout, stderr=stderr, env=env))
    for proc, (_, err) in zip(procs, logs, strict=True):
        assert proc.wait(timeout=600) == 0, err.read_text()[-3000:]
    x = tokens()
    r1 = lambda p: fastgp.naive_gradient_penalty(lambda y: transformer_critic(p, y), x, kind="r1")
    layouts = {"tokens within, ring": 2, "tokens across, ring": 2, "tokens across, all-to-all": 4}
    wants = {heads: jax.value_and_grad(r1)(critic_params(heads)) for heads in set(layouts.values())}
    for out, _ in logs:
        got = json.loads(out.read_text().strip().splitlines()[-1])
        assert sorted(got) == sorted(layouts)
        for layout, heads in layouts.items():
            want_value, want_grads = wants[heads]
            np.testing.assert_allclose(got[layout]["value"], want_value, rtol=RTOL)
            for name, want in want_grads.items():
                error = np.max(np.abs(np.asarray(got[layout]["grads"][name]) - np.asarray(want)))
                assert error <= RTOL * np.max(np.abs(want)), (layout, name)
