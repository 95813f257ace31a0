"""Plain-JAX models as pure functions; parameters are pytrees of float32 arrays.

    mlp(sizes, activation)                -> Model  (B, sizes[0]) -> (B, sizes[-1]), (B,) if 1
    conv_critic(channels, activation)     -> Model  (B, 8, 8, 1) -> (B,)
    conv_generator(latent_dim, channels, activation, output)
                                          -> Model  (B, latent_dim) -> (B, 8, 8, 1) in [-1, 1]

Every ``apply(params, x, dtype=jnp.float32)`` computes in ``dtype`` (params and inputs are cast,
so bfloat16 works) and returns float32. No batch norm anywhere: each output sample depends only on
its own input, which the per-sample gradient penalty requires. Images are NHWC with HWIO kernels,
the layout TPU convolutions (and Flax) use, so no transposes surround the convolutions there.
"""

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp


class Model(NamedTuple):
    """``init(key) -> params`` and ``apply(params, x, dtype=jnp.float32) -> float32 output``."""

    init: Callable[..., Any]
    apply: Callable[..., Any]


ACTIVATIONS = {
    "relu": jax.nn.relu,
    "leaky_relu": lambda x: jax.nn.leaky_relu(x, 0.2),
    "elu": jax.nn.elu,
    "gelu": jax.nn.gelu,
    "silu": jax.nn.silu,
    "tanh": jnp.tanh,
}
_RELU_LIKE = ("relu", "leaky_relu", "elu", "gelu", "silu")


def _activation(name: str) -> Callable[[jax.Array], jax.Array]:
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; valid: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def _cast(tree: Any, dtype: Any) -> Any:
    return jax.tree.map(lambda a: a.astype(dtype), tree)


def _dense_init(key: jax.Array, fan_in: int, fan_out: int, he: bool) -> dict[str, jax.Array]:
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

    def init(key: jax.Array) -> list[dict[str, jax.Array]]:
        keys = jax.random.split(key, len(sizes) - 1)
        return [
            _dense_init(k, i, o, he and n < len(sizes) - 2)
            for n, (k, i, o) in enumerate(zip(keys, sizes[:-1], sizes[1:], strict=True))
        ]

    def apply(params: Any, x: jax.Array, dtype: Any = jnp.float32) -> jax.Array:
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


def _conv_init(key: jax.Array, c_out: int, c_in: int, k: int = 3) -> dict[str, jax.Array]:
    """He-normal (k, k, c_in, c_out) HWIO kernel, zero bias."""
    std = math.sqrt(2.0 / (c_in * k * k))
    w = std * jax.random.normal(key, (k, k, c_in, c_out), jnp.float32)
    return {"w": w, "b": jnp.zeros((c_out,), jnp.float32)}


def _conv(h: jax.Array, w: jax.Array, stride: int = 1) -> jax.Array:
    """SAME convolution of NHWC ``h`` with an HWIO kernel."""
    return jax.lax.conv_general_dilated(h, w, (stride, stride), "SAME", dimension_numbers=_DN)


def _upsample(h: jax.Array) -> jax.Array:
    """Nearest-neighbour 2x upsampling of NHWC ``h`` (every pixel repeated 2x2)."""
    return jnp.repeat(jnp.repeat(h, 2, axis=1), 2, axis=2)


def conv_critic(channels: int = 64, activation: str = "leaky_relu") -> Model:
    """Conv critic for (B, 8, 8, 1): a stride-1 3x3 conv at 8x8 (``channels``), two stride-2 3x3
    convs (8->4->2; ``channels``, then twice that), each followed by ``activation`` (LeakyReLU 0.2
    by default), then a dense layer -> (B,)."""
    c1, c2 = channels, 2 * channels
    act = _activation(activation)

    def init(key: jax.Array) -> dict[str, Any]:
        k0, k1, k2, k3 = jax.random.split(key, 4)
        return {
            "conv0": _conv_init(k0, c1, 1),
            "conv1": _conv_init(k1, c1, c1),
            "conv2": _conv_init(k2, c2, c1),
            "out": _dense_init(k3, c2 * 2 * 2, 1, he=False),
        }

    def apply(params: Any, x: jax.Array, dtype: Any = jnp.float32) -> jax.Array:
        p = _cast(params, dtype)
        h = x.astype(dtype)
        for name, stride in (("conv0", 1), ("conv1", 2), ("conv2", 2)):
            h = act(_conv(h, p[name]["w"], stride) + p[name]["b"])
        h = h.reshape(h.shape[0], -1)
        return (h @ p["out"]["w"] + p["out"]["b"])[:, 0].astype(jnp.float32)

    return Model(init, apply)


OUTPUTS = {"clip": lambda x: jnp.clip(x, -1.0, 1.0), "tanh": jnp.tanh}


def conv_generator(
    latent_dim: int = 32, channels: int = 64, activation: str = "relu", output: str = "clip"
) -> Model:
    """Conv generator: z (B, latent_dim) -> dense (4x4, 2 * ``channels``) -> ``activation`` ->
    a 3x3 conv at 4x4 (2 * ``channels``) -> nearest-neighbour 2x upsampling -> two 3x3 convs at
    8x8 (``channels``), each followed by ``activation`` -> a stride-1 3x3 conv to one channel ->
    ``output`` (``OUTPUTS``: "clip" to [-1, 1], the default, or "tanh"), (B, 8, 8, 1).

    Upsampling by repetition, not transposed convolutions, and stride-1 convs after it: every
    output pixel sees the same neighbourhood, so no stride pattern shows in the samples.
    Clipping reaches the data's exact -1 background, which tanh only approaches."""
    if output not in OUTPUTS:
        raise ValueError(f"unknown output {output!r}; valid: {', '.join(OUTPUTS)}")
    wide, narrow = 2 * channels, channels
    act, out = _activation(activation), OUTPUTS[output]

    def init(key: jax.Array) -> dict[str, Any]:
        k0, k1, k2, k3, k4 = jax.random.split(key, 5)
        return {
            "proj": _dense_init(k0, latent_dim, wide * 4 * 4, he=True),
            "conv4": _conv_init(k1, wide, wide),
            "conv8a": _conv_init(k2, narrow, wide),
            "conv8b": _conv_init(k3, narrow, narrow),
            "out": _conv_init(k4, 1, narrow),
        }

    def apply(params: Any, z: jax.Array, dtype: Any = jnp.float32) -> jax.Array:
        p = _cast(params, dtype)
        h = act(z.astype(dtype) @ p["proj"]["w"] + p["proj"]["b"])
        h = act(_conv(h.reshape(h.shape[0], 4, 4, wide), p["conv4"]["w"]) + p["conv4"]["b"])
        h = _upsample(h)
        for name in ("conv8a", "conv8b"):
            h = act(_conv(h, p[name]["w"]) + p[name]["b"])
        return out(_conv(h, p["out"]["w"]) + p["out"]["b"]).astype(jnp.float32)

    return Model(init, apply)


__all__ = ["ACTIVATIONS", "Model", "OUTPUTS", "conv_critic", "conv_generator", "mlp"]
