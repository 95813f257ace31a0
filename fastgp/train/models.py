"""Plain-JAX models as pure functions; parameters are pytrees of float32 arrays.

    mlp(sizes, activation)                -> Model  (B, sizes[0]) -> (B, sizes[-1]), (B,) if 1
    conv_critic(channels, activation)     -> Model  (B, 8, 8, 1) -> (B,)
    conv_generator(latent_dim, channels)  -> Model  (B, latent_dim) -> (B, 8, 8, 1) in [-1, 1]

Every ``apply(params, x, dtype=jnp.float32)`` computes in ``dtype`` (params and inputs are cast,
so bfloat16 works) and returns float32. No batch norm anywhere: each output sample depends only on
its own input, which the per-sample gradient penalty requires. Images are NHWC with HWIO kernels,
the layout TPU convolutions (and Flax) use, so no transposes surround the convolutions there.
"""

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp


class Model(NamedTuple):
    """``init(key) -> params`` and ``apply(params, x, dtype=jnp.float32) -> float32 output``."""

    init: Callable
    apply: Callable


ACTIVATIONS = {
    "relu": jax.nn.relu,
    "leaky_relu": lambda x: jax.nn.leaky_relu(x, 0.2),
    "elu": jax.nn.elu,
    "gelu": jax.nn.gelu,
    "silu": jax.nn.silu,
    "tanh": jnp.tanh,
}
_RELU_LIKE = ("relu", "leaky_relu", "elu", "gelu", "silu")


def _activation(name):
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; valid: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def _cast(tree, dtype):
    return jax.tree.map(lambda a: a.astype(dtype), tree)


def _dense_init(key, fan_in, fan_out, he):
    """He-normal (ReLU-like layers) or Glorot-normal weights, zero bias."""
    std = math.sqrt(2.0 / fan_in) if he else math.sqrt(2.0 / (fan_in + fan_out))
    w = std * jax.random.normal(key, (fan_in, fan_out), jnp.float32)
    return {"w": w, "b": jnp.zeros((fan_out,), jnp.float32)}


def mlp(sizes: Sequence[int], activation: str = "relu") -> Model:
    """Dense network with layer widths ``sizes`` (input first); no activation after the last layer.

    With ``sizes[-1] == 1`` the output is squeezed to (B,), the shape a critic returns.
    """
    sizes = tuple(int(s) for s in sizes)
    if len(sizes) < 2 or min(sizes) < 1:
        raise ValueError(f"mlp needs at least two positive sizes (input, output), got {sizes}")
    act = _activation(activation)
    he = activation in _RELU_LIKE

    def init(key):
        keys = jax.random.split(key, len(sizes) - 1)
        return [
            _dense_init(k, i, o, he and n < len(sizes) - 2)
            for n, (k, i, o) in enumerate(zip(keys, sizes[:-1], sizes[1:], strict=True))
        ]

    def apply(params, x, dtype=jnp.float32):
        params = _cast(params, dtype)
        h = x.astype(dtype)
        for layer in params[:-1]:
            h = act(h @ layer["w"] + layer["b"])
        out = h @ params[-1]["w"] + params[-1]["b"]
        if sizes[-1] == 1:
            out = out[:, 0]
        return out.astype(jnp.float32)

    return Model(init, apply)


_DN = ("NHWC", "HWIO", "NHWC")


def _conv_init(key, c_out, c_in, k=3):
    """He-normal (k, k, c_in, c_out) HWIO kernel, zero bias."""
    std = math.sqrt(2.0 / (c_in * k * k))
    w = std * jax.random.normal(key, (k, k, c_in, c_out), jnp.float32)
    return {"w": w, "b": jnp.zeros((c_out,), jnp.float32)}


def conv_critic(channels: int = 64, activation: str = "leaky_relu") -> Model:
    """DCGAN-style critic for (B, 8, 8, 1): two stride-2 3x3 convs (8->4->2), each followed by
    ``activation`` (LeakyReLU 0.2 by default), then a dense layer -> (B,)."""
    c1, c2 = channels, 2 * channels
    act = _activation(activation)

    def init(key):
        k1, k2, k3 = jax.random.split(key, 3)
        return {
            "conv1": _conv_init(k1, c1, 1),
            "conv2": _conv_init(k2, c2, c1),
            "out": _dense_init(k3, c2 * 2 * 2, 1, he=False),
        }

    def apply(params, x, dtype=jnp.float32):
        p = _cast(params, dtype)
        h = x.astype(dtype)
        for name in ("conv1", "conv2"):
            h = jax.lax.conv_general_dilated(h, p[name]["w"], (2, 2), "SAME", dimension_numbers=_DN)
            h = act(h + p[name]["b"])
        h = h.reshape(h.shape[0], -1)
        return (h @ p["out"]["w"] + p["out"]["b"])[:, 0].astype(jnp.float32)

    return Model(init, apply)


def conv_generator(latent_dim: int = 32, channels: int = 64, activation: str = "relu") -> Model:
    """DCGAN-style generator: z (B, latent_dim) -> dense (2x2) -> ``activation`` -> two stride-2
    transposed convs (2->4->8), ``activation`` between them -> tanh, output (B, 8, 8, 1)."""
    c1, c2 = 2 * channels, channels
    act = _activation(activation)

    def init(key):
        k1, k2, k3 = jax.random.split(key, 3)
        return {
            "proj": _dense_init(k1, latent_dim, c1 * 2 * 2, he=True),
            "up1": _conv_init(k2, c2, c1),
            "up2": _conv_init(k3, 1, c2),
        }

    def apply(params, z, dtype=jnp.float32):
        p = _cast(params, dtype)
        h = act(z.astype(dtype) @ p["proj"]["w"] + p["proj"]["b"])
        h = h.reshape(h.shape[0], 2, 2, c1)
        h = jax.lax.conv_transpose(h, p["up1"]["w"], (2, 2), "SAME", dimension_numbers=_DN)
        h = act(h + p["up1"]["b"])
        h = jax.lax.conv_transpose(h, p["up2"]["w"], (2, 2), "SAME", dimension_numbers=_DN)
        return jnp.tanh(h + p["up2"]["b"]).astype(jnp.float32)

    return Model(init, apply)


__all__ = ["ACTIVATIONS", "Model", "conv_critic", "conv_generator", "mlp"]
