"""Ahead-of-time compilation for real TPU generations through libtpu's compile-only client.

The real Mosaic compiler runs here: misaligned blocks, VMEM overflow and layout conflicts with
the surrounding XLA program surface as compile errors, per generation.
"""

import functools
import re

import jax
import jax.numpy as jnp
import pytest

from fastgp import penalty
from fastgp.kernels.penalty import lane_blocks, lane_sumsq, row_blocks, row_sumsq

pytestmark = pytest.mark.aot
pytest.importorskip("jax.experimental.topologies")
from fastgp._measure import compiled as cf  # noqa: E402

GENERATIONS = tuple(cf.TOPOLOGIES)
DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16}


def compile_text(generation, fn, *shapes):
    return cf.compile_for(cf.tpu_device(generation), fn, *shapes).as_text()


@pytest.mark.parametrize("generation", GENERATIONS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(300, 5000), (64, 12288), (5, 3), (1, 1)], ids=str)
def test_row_kernel_compiles_with_generation_tiling(generation, dtype, shape):
    batch, features = shape
    blocks = row_blocks(batch, features, jnp.dtype(DTYPES[dtype]).itemsize, generation)
    text = compile_text(
        generation,
        lambda g: row_sumsq(g, blocks=blocks),
        jax.ShapeDtypeStruct(shape, DTYPES[dtype]),
    )
    assert "tpu_custom_call" in text


@pytest.mark.parametrize("generation", GENERATIONS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape", [(64, 64, 3, 64), (32, 32, 1, 300), (7, 5, 2), (1, 1, 1)], ids=str
)
def test_lane_kernel_compiles_with_generation_tiling(generation, dtype, shape):
    *lead, sublanes, batch = shape
    blocks = lane_blocks(int(jnp.prod(jnp.array(lead))), sublanes, batch, generation)
    text = compile_text(
        generation,
        lambda g: lane_sumsq(g, blocks=blocks),
        jax.ShapeDtypeStruct(shape, DTYPES[dtype]),
    )
    assert "tpu_custom_call" in text


def conv_critic(layout):
    dn = ("NCHW", "OIHW", "NCHW") if layout == "NCHW" else ("NHWC", "HWIO", "NHWC")

    def critic(params, x):
        h = jax.lax.conv_general_dilated(x, params["w1"], (2, 2), "SAME", dimension_numbers=dn)
        h = jax.nn.leaky_relu(h, 0.2).reshape(x.shape[0], -1)
        return (h @ params["w2"])[:, 0]

    return critic


def conv_params(image_shape, layout, dtype, channels=8):
    c, hgt, wid = image_shape if layout == "NCHW" else (image_shape[2], *image_shape[:2])
    flat = channels * ((hgt + 1) // 2) * ((wid + 1) // 2)
    w1 = (channels, c, 3, 3) if layout == "NCHW" else (3, 3, c, channels)
    return {"w1": jax.ShapeDtypeStruct(w1, dtype), "w2": jax.ShapeDtypeStruct((flat, 1), dtype)}


@pytest.mark.parametrize("generation", GENERATIONS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_whole_critic_penalty_value_and_grad_compiles(generation, dtype):
    """Ragged everything: B = 12, a 3x10x10 image leaf and a dense leaf of 5, both kernels."""
    dt = DTYPES[dtype]
    params = conv_params((3, 10, 10), "NCHW", dt)
    x = {
        "image": jax.ShapeDtypeStruct((12, 3, 10, 10), dt),
        "extra": jax.ShapeDtypeStruct((12, 5), dt),
    }

    def critic(p, x):
        return conv_critic("NCHW")(p, x["image"]) + jnp.sum(x["extra"], axis=1)

    def loss(p, x):
        return penalty.gradient_penalty(lambda y: critic(p, y), x, backend="pallas")

    text = compile_text(generation, jax.value_and_grad(loss), params, x)
    assert text.count('custom_call_target="tpu_custom_call"') == 2


def kernel_operand_producers(hlo_text):
    """The op producing each Mosaic call's operand, looking through bitcasts and tuple elements."""
    instruction = re.compile(r"^\s*(?:ROOT )?(%[\w.\-]+) = .*? ([a-z][\w\-]*)\((%[\w.\-]+)?")
    ops, kernels = {}, []
    for line in hlo_text.splitlines():
        match = instruction.match(line)
        if match:
            ops[match.group(1)] = match.group(2, 3)
            if 'custom_call_target="tpu_custom_call"' in line:
                kernels.append(match.group(1))
    producers = []
    for name in kernels:
        operand = ops[name][1]
        while ops[operand][0] in ("bitcast", "get-tuple-element"):
            operand = ops[operand][1]
        producers.append(ops[operand][0])
    return producers


@pytest.mark.parametrize("generation", GENERATIONS)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_bf16_image_critic_step_reads_g_where_the_convolution_wrote_it(generation, layout):
    """The shape where a (B, D) bf16 tiling failed on TPU7x inside a whole step. The kernel's
    operand is the fusion that writes the input gradient (through a bitcast), not a relayout
    copy; the default backend's program has no kernel (see fastgp._penalty.binding)."""
    image = (3, 64, 64) if layout == "NCHW" else (64, 64, 3)
    params = conv_params(image, layout, jnp.bfloat16, channels=4)
    x = jax.ShapeDtypeStruct((64, *image), jnp.bfloat16)

    def loss(p, x, backend):
        return penalty.gradient_penalty(lambda y: conv_critic(layout)(p, y), x, backend=backend)

    step = functools.partial(jax.value_and_grad(loss), backend="pallas")
    assert kernel_operand_producers(compile_text(generation, step, params, x)) == ["fusion"]
    # whether a program holds the kernel is settled when it is lowered; no need to compile it
    step = functools.partial(jax.value_and_grad(loss), backend="auto")
    lowered = cf.lower_for(cf.tpu_device(generation), step, params, x).as_text()
    assert "tpu_custom_call" not in lowered


# --- Sharded whole steps under jax.jit with NamedSharding (explicit mesh, no shard_map) --------

from benchmarks.tpu import sharded_compile as sharded  # noqa: E402 (with the section using it)


@pytest.mark.parametrize("mesh", list(sharded.MESHES))
def test_sharded_bf16_critic_step_holds_the_kernel_and_gathers_no_input(mesh):
    """Batch over 4 chips (v5e, v6e, TPU7x), or over 4 x 2 v5p chips with the image height over
    "model": the Mosaic call is in each chip's program, and nothing batch-shaped (x, g) is
    gathered or exchanged all-to-all; the only all-gathers are of parameters."""
    spec = sharded.CRITIC._replace(model=sharded.W.meanpool_critic(8, 32), batch=64)
    compiled = sharded.compile_sharded(mesh, "fastgp-pallas", spec)
    text = compiled.as_text()
    assert "tpu_custom_call" in text
    counts = sharded.collectives(text)
    assert counts["all-to-all"] == 0
    local_batch = spec.batch // sharded.MESHES[mesh][1][0]
    for result in counts["gathered"]:
        match = re.match(r"\w+\[([\d,]*)\]", result)
        assert match is not None, result
        dims = match.group(1).split(",")
        assert dims[0] not in (str(spec.batch), str(local_batch)), result
    if mesh != "v5p":
        assert counts["gathered"] == []
