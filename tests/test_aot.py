"""Ahead-of-time compilation for real TPU generations through libtpu's compile-only client.

The real Mosaic compiler runs here: misaligned blocks, VMEM overflow and layout conflicts with
the surrounding XLA program surface as compile errors, per generation.
"""

import functools

import jax
import jax.numpy as jnp
import pytest

from fastgp import penalty
from fastgp.kernels import choose_blocks, row_stats, scale_rows

pytestmark = pytest.mark.aot
topologies = pytest.importorskip("jax.experimental.topologies")

GENERATIONS = {"v4": "v4:2x2x1", "v5e": "v5e:2x2", "v5p": "v5p:2x2x1", "v6e": "v6e:2x2",
               "7x": "TPU7x:2x2x1"}
DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16}


@functools.cache
def tpu_sharding(generation):
    device = topologies.get_topology_desc(GENERATIONS[generation], "tpu").devices[0]
    return jax.sharding.SingleDeviceSharding(device)


def compile_for(generation, fn, *shapes):
    sharding = tpu_sharding(generation)
    lowered = jax.jit(fn, in_shardings=(sharding,) * len(shapes)).lower(*shapes)
    return lowered.compile().as_text()


def conv_critic(params, x):
    h = jax.lax.conv_general_dilated(x, params["w1"], (2, 2), "SAME",
                                     dimension_numbers=("NCHW", "OIHW", "NCHW"))
    h = jax.nn.leaky_relu(h, 0.2).reshape(x.shape[0], -1)
    return (h @ params["w2"])[:, 0]


def conv_params(in_shape, dtype, channels=8):
    c, hgt, wid = in_shape
    flat = channels * ((hgt + 1) // 2) * ((wid + 1) // 2)
    return {"w1": jax.ShapeDtypeStruct((channels, c, 3, 3), dtype),
            "w2": jax.ShapeDtypeStruct((flat, 1), dtype)}


@pytest.mark.parametrize("generation", GENERATIONS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch,features", [(300, 5000), (5, 3), (1, 1)])
def test_kernels_compile_with_generation_tiling(generation, dtype, batch, features):
    dt = DTYPES[dtype]
    blocks = choose_blocks(batch, features, jnp.dtype(dt).itemsize, generation)
    g = jax.ShapeDtypeStruct((batch, features), dt)
    scale = jax.ShapeDtypeStruct((batch,), jnp.float32)
    forward = compile_for(generation, lambda g: row_stats(g, kind="wgan-gp", blocks=blocks), g)
    backward = compile_for(generation, lambda s, g: scale_rows(s, g, blocks=blocks), scale, g)
    assert "tpu_custom_call" in forward and "tpu_custom_call" in backward


@pytest.mark.parametrize("generation", GENERATIONS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_whole_critic_penalty_value_and_grad_compiles(generation, dtype):
    """Ragged everything: B = 12, D = 3 * 10 * 10 = 300, a two-leaf pytree input."""
    dt = DTYPES[dtype]
    params = conv_params((3, 10, 10), dt)
    x = {"image": jax.ShapeDtypeStruct((12, 3, 10, 10), dt),
         "extra": jax.ShapeDtypeStruct((12, 5), dt)}

    def critic(p, x):
        return conv_critic(p, x["image"]) + jnp.sum(x["extra"], axis=1)

    def loss(p, x):
        return penalty.gradient_penalty(lambda y: critic(p, y), x, backend="auto")

    text = compile_for(generation, jax.value_and_grad(loss), params, x)
    # Two kernels: stats of leaf 1, then fused stats + penalty of leaf 2 (the backward is XLA's).
    assert text.count("tpu_custom_call") >= 2


@pytest.mark.parametrize("generation", ["7x", "v5e"])
def test_bf16_image_critic_step_compiles(generation):
    """The shape where a naive (8, 512) bf16 tiling failed on TPU7x inside a whole step."""
    params = conv_params((3, 64, 64), jnp.bfloat16, channels=4)
    x = jax.ShapeDtypeStruct((64, 3, 64, 64), jnp.bfloat16)

    def loss(p, x):
        return penalty.gradient_penalty(lambda y: conv_critic(p, y), x, backend="pallas")

    assert "tpu_custom_call" in compile_for(generation, jax.value_and_grad(loss), params, x)
