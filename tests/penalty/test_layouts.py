"""Every layout against one device: the penalty through a transformer critic on 8 CPU devices.

Layouts: data parallel, FSDP (every weight split over the batch axis), tensor parallel (heads
over "model"), sequence parallel (tokens over "seq") and a 2-D batch x sequence mesh; in each mode
the layout allows: inside ``shard_map`` (the axes named), Auto ``jax.jit`` and explicit axes (the
arrays global). For WGAN-GP and R1 and both second orders: the value, the parameter gradients
and a Hessian-vector product, each within 1e-5 of the largest entry of the one-device naive
penalty's, in float64 but for fastgp.attention's float32 accumulation. ``LAYOUTS`` is the table
docs/recipes.md renders; its refusals are tested here too.

The kinds are the two quantities a layout must combine: WGAN-GP's norm and R1's sum of squares.
WGAN-LP is WGAN-GP's norm with ``max(0, .)`` applied after the same reductions
(fastgp/_penalty/kinds.py); tests/penalty/test_sample_axes.py holds it under split samples.
"""

import functools
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import fastgp
from oracles import to64, value_grad_hvp

B, T, C, WIDTH, HEADS = 8, 32, 4, 8, 2
# The critic in float64 (x64): fastgp.attention's float32 accumulation is the only rounding, 6e-7
# to 1.1e-6 of the largest entry (2e-6 with the whole critic in float32), within 20% on AVX-512,
# AVX2, SSE4.2 and one-threaded Eigen: 1e-5 leaves 9x.
RTOL = 1e-5
VARIANTS = [(k, s) for k in ("wgan-gp", "r1") for s in ("reverse-over-forward", "reverse")]


def init():
    """float64 parameters and inputs, float32 draws cast (under ``jax.enable_x64(True)``)."""
    ks = jax.random.split(jax.random.PRNGKey(21), 6)
    normal = lambda key, shape: jax.random.normal(key, shape, jnp.float32)
    params = {
        "embed": normal(ks[0], (C, WIDTH)) * 0.5,
        "pos": normal(ks[1], (T, WIDTH)) * 0.3,
        "qkv": normal(ks[2], (WIDTH, 3, HEADS, WIDTH // HEADS)) * 0.4,
        "out": normal(ks[3], (HEADS, WIDTH // HEADS, WIDTH)) * 0.4,
        # norms well above the target: no sample sits where n / t - 1 cancels in float32
        "head": normal(ks[4], (WIDTH,)) * 20,
    }
    return to64((params, normal(ks[5], (B, T, C))))


def critic(p, x, seq=None, model=None, fsdp=None):
    """A pre-attention token critic. Inside shard_map: ``seq`` splits the tokens, ``model`` the
    heads (the weights hold this device's heads), ``fsdp`` every weight's first axis."""
    if fsdp is not None:
        p = jax.tree.map(lambda a: lax.all_gather(a, fsdp, axis=0, tiled=True), p)
    t = x.shape[1]
    start = 0 if seq is None else lax.axis_index(seq) * t
    h = x @ p["embed"] + lax.dynamic_slice_in_dim(p["pos"], start, t)
    q, k, v = (jnp.einsum("btc,chd->bthd", h, p["qkv"][:, i]) for i in range(3))
    # split tokens: the ring in every mode (2 heads over 4 devices: "auto" takes it)
    o = fastgp.attention(q, k, v, is_causal=True, sample_axis_name=seq)
    out = jnp.einsum("bthd,hdc->btc", o, p["out"])
    if model is not None:
        out = lax.psum(out, model)
    pooled = jnp.sum(h + out, axis=1)
    if seq is not None:
        pooled = lax.psum(pooled, seq)
    return jnp.tanh(pooled / T) @ p["head"]


def tangent_of(params):
    return jax.tree.map(
        lambda a: jnp.cos(jnp.arange(a.size, dtype=a.dtype)).reshape(a.shape), params
    )


def all_variants(penalty_of, params, tangent):
    """{(kind, second_order): (value, gradient, Hessian-vector product)} of one program."""
    out = {}
    for kind, second_order in VARIANTS:
        loss = functools.partial(penalty_of, kind=kind, second_order=second_order)
        out[kind, second_order] = value_grad_hvp(loss, params, tangent)
    return out


@functools.cache
def one_device():
    params, x = init()

    def penalty_of(p, kind, second_order):
        return fastgp.naive_gradient_penalty(lambda y: critic(p, y), x, kind=kind)

    return jax.jit(lambda p, t: all_variants(penalty_of, p, t))(params, tangent_of(params))


# layout: mesh shape and names, x's spec, the weights' specs (a tree or one spec for all), and
# the shard_map names: axis_name, sample_axis_name, and the critic's keywords.
LAYOUTS: dict[str, dict[str, Any]] = {
    "data parallel": dict(
        mesh=((8,), ("data",)), x=P("data"), params=P(), axis_name="data", critic={}
    ),
    "FSDP": dict(
        mesh=((2,), ("data",)),
        x=P("data"),
        params=P("data"),
        axis_name="data",
        critic={"fsdp": "data"},
    ),
    "tensor parallel": dict(
        mesh=((2, 2), ("data", "model")),
        x=P("data"),
        params={
            "embed": P(),
            "pos": P(),
            "qkv": P(None, None, "model"),
            "out": P("model"),
            "head": P(),
        },
        axis_name="data",
        critic={"model": "model"},
    ),
    "sequence parallel": dict(
        mesh=((4,), ("seq",)),
        x=P(None, "seq"),
        params=P(),
        sample_axis_name="seq",
        critic={"seq": "seq"},
    ),
    "batch x sequence": dict(
        mesh=((2, 4), ("data", "seq")),
        x=P("data", "seq"),
        params=P(),
        axis_name="data",
        sample_axis_name="seq",
        critic={"seq": "seq"},
    ),
}
# Explicit axes need every contraction over a sharded axis spelled out in the critic (JAX's
# rule for explicitly sharded models), which the FSDP and tensor-parallel critics here do not.
MODES = {
    "shard_map": list(LAYOUTS),
    "auto": list(LAYOUTS),
    "explicit": ["data parallel", "sequence parallel", "batch x sequence"],
}


def params_specs(layout, params):
    spec = layout["params"]
    return spec if isinstance(spec, dict) else jax.tree.map(lambda _: spec, params)


def placed(mesh, specs, tree):
    return jax.tree.map(lambda a, s: jax.device_put(a, NamedSharding(mesh, s)), tree, specs)


def run(layout_name, mode):
    layout = LAYOUTS[layout_name]
    shape, names = layout["mesh"]
    types = AxisType.Explicit if mode == "explicit" else AxisType.Auto
    mesh = jax.make_mesh(shape, names, axis_types=(types,) * len(shape))
    params, x = init()
    tangent = tangent_of(params)
    specs = params_specs(layout, params)
    params, tangent = placed(mesh, specs, params), placed(mesh, specs, tangent)
    x = jax.device_put(x, NamedSharding(mesh, layout["x"]))
    if mode == "shard_map":

        def local(p, t, x):
            def penalty_of(p, kind, second_order):
                return fastgp.gradient_penalty(
                    lambda y: critic(p, y, **layout["critic"]),
                    x,
                    kind=kind,
                    second_order=second_order,
                    axis_name=layout.get("axis_name"),
                    sample_axis_name=layout.get("sample_axis_name"),
                )

            return all_variants(penalty_of, p, t)

        out_specs = {v: (P(), specs, specs) for v in VARIANTS}
        mapped = jax.shard_map(
            local, mesh=mesh, in_specs=(specs, specs, layout["x"]), out_specs=out_specs
        )
        return jax.jit(mapped)(params, tangent, x)

    def step(p, t, x):
        def penalty_of(p, kind, second_order):
            return fastgp.gradient_penalty(
                lambda y: critic(p, y), x, kind=kind, second_order=second_order
            )

        return all_variants(penalty_of, p, t)

    with jax.set_mesh(mesh):
        return jax.jit(step)(params, tangent, x)


CASES = [(layout, mode) for mode, layouts in MODES.items() for layout in layouts]
CAVEAT = "not run: JAX asks the critic to spell out its sharded contractions"


def layouts_table() -> str:
    """The markdown table docs/recipes.md shows between its ``layouts`` marks."""
    rows = [
        "| layout | mesh | x split as | inside `shard_map` | Auto `jax.jit` | explicit axes |",
        "|---|---|---|---|---|---|",
    ]
    for name, layout in LAYOUTS.items():
        shape, names = layout["mesh"]
        mesh = " x ".join(f"{n} {a}" for n, a in zip(shape, names, strict=True))
        spelled = ", ".join(
            f"`{key}={layout[key]!r}`" for key in ("axis_name", "sample_axis_name") if key in layout
        )
        marks = [
            "✓ " + spelled if name in MODES["shard_map"] else "",
            "✓" if name in MODES["auto"] else "",
            "✓" if name in MODES["explicit"] else CAVEAT,
        ]
        rows.append(f"| {name} | {mesh} | `{layout['x']}` | " + " | ".join(marks) + " |")
    return "\n".join(rows)


def test_the_docs_render_this_table():
    text = (Path(__file__).parents[2] / "docs" / "recipes.md").read_text()
    block = text.split("<!-- layouts -->\n")[1].split("\n<!-- /layouts -->")[0]
    assert block == layouts_table()


@pytest.mark.slow
@pytest.mark.parametrize("layout, mode", CASES, ids=[f"{name}-{mode}" for name, mode in CASES])
@jax.enable_x64(True)
def test_layout_equals_one_device(layout, mode):
    got, want = run(layout, mode), one_device()
    parts = ("value", "gradient", "hvp")
    for variant in VARIANTS:
        for part, g, w in zip(parts, got[variant], want[variant], strict=True):
            for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(w), strict=True):
                error = float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
                scale = float(np.max(np.abs(np.asarray(b, np.float64))))
                assert error <= RTOL * scale, (variant, part, error, scale)
