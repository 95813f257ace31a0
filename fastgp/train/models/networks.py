"""Plain-JAX models as pure functions; parameters are pytrees of float32 arrays.

    mlp(sizes, activation)                -> Model  (B, sizes[0]) -> (B, sizes[-1]), (B,) if 1
    conv_critic(channels, activation, image)
                                          -> Model  (B, H, W, C) -> (B,)  (default 8x8x1)
    conv_generator(latent_dim, channels, activation, output, image)
                                          -> Model  (B, latent_dim) -> (B, H, W, C) in [-1, 1]
    vit_critic(width, depth, heads, patch, image)
                                          -> Model  (B, H, W, C) -> (B,)   (a small ViT)

Every ``apply(params, x, dtype=jnp.float32)`` computes in ``dtype`` (params and inputs are cast,
so bfloat16 works) and returns float32. No batch norm anywhere: each output sample depends only on
its own input, which the per-sample gradient penalty requires (the ViT's LayerNorm normalises each
token of each sample over its channels, and its attention runs over the tokens of one sample).
Images are NHWC with HWIO kernels, the layout TPU convolutions (and Flax) use, so no transposes
surround the convolutions there.
"""

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

import fastgp


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


Image = tuple[int, int, int]  # (height, width, channels) of one NHWC sample


def conv_critic(
    channels: int = 64, activation: str = "leaky_relu", image: Image = (8, 8, 1)
) -> Model:
    """Conv critic for (B, H, W, C) = ``image``: a stride-1 3x3 conv (``channels``), two stride-2
    3x3 convs (``channels``, then twice that; 8x8 -> 4x4 -> 2x2, 28x28 -> 14x14 -> 7x7), each
    followed by ``activation`` (LeakyReLU 0.2 by default), then a dense layer -> (B,)."""
    c1, c2 = channels, 2 * channels
    act = _activation(activation)
    height, side, c_in = image
    flat = c2 * -(-height // 4) * -(-side // 4)  # SAME stride-2 convs round up

    def init(key: jax.Array) -> dict[str, Any]:
        k0, k1, k2, k3 = jax.random.split(key, 4)
        return {
            "conv0": _conv_init(k0, c1, c_in),
            "conv1": _conv_init(k1, c1, c1),
            "conv2": _conv_init(k2, c2, c1),
            "out": _dense_init(k3, flat, 1, he=False),
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


def generator_sides(image: Image) -> tuple[tuple[int, int], ...]:
    """The (height, width) a :func:`conv_generator` for ``image`` works at, smallest first: the
    image's halved while both sides are even and stay at least 4 (8x8: 4, 8; 28x28: 7, 14, 28).
    ValueError for an image it cannot halve once."""
    sides = [(image[0], image[1])]
    while all(s % 2 == 0 and s // 2 >= 4 for s in sides[0]):
        sides.insert(0, (sides[0][0] // 2, sides[0][1] // 2))
    if len(sides) < 2:
        raise ValueError(
            f"conv_generator: image {image[0]}x{image[1]} must have even sides of at least 8 "
            f"(it upsamples from half or less)"
        )
    return tuple(sides)


def conv_generator(
    latent_dim: int = 32,
    channels: int = 64,
    activation: str = "relu",
    output: str = "clip",
    image: Image = (8, 8, 1),
    head_channels: int | None = None,
) -> Model:
    """Conv generator for (B, H, W, C) = ``image``: z (B, latent_dim) -> dense to the smallest
    side of :func:`generator_sides` (4x4 for 8x8, 7x7 for 28x28) with 2 * ``channels`` ->
    ``activation`` -> a 3x3 conv there (2 * ``channels``) -> per larger side: nearest-neighbour 2x
    upsampling, then a 3x3 conv (2 * ``channels``; at the image's side two, of
    ``head_channels``, default ``channels``), each followed by ``activation`` -> a stride-1 3x3
    conv to C channels -> ``output``
    (``OUTPUTS``: "clip" to [-1, 1], the default, or "tanh"). Parameters "proj", "conv<side>"
    per side ("conv4", "conv8a", "conv8b" for 8x8), "out".

    Upsampling by repetition, not transposed convolutions, and stride-1 convs after it: every
    output pixel sees the same neighbourhood, so no stride pattern shows in the samples.
    Clipping reaches the data's exact -1 background, which tanh only approaches. At 28x28 the
    image-side convs take most of a step's time on a CPU, hence ``head_channels``."""
    if output not in OUTPUTS:
        raise ValueError(f"unknown output {output!r}; valid: {', '.join(OUTPUTS)}")
    wide, narrow = 2 * channels, head_channels or channels
    act, out = _activation(activation), OUTPUTS[output]
    sides = generator_sides(image)
    (h0, w0), last = sides[0], sides[-1][0]
    # (name, c_out, c_in, upsample first): every conv but the output one, in order
    convs = [(f"conv{h0}", wide, wide, False)]
    convs += [(f"conv{h}", wide, wide, True) for h, _ in sides[1:-1]]
    convs += [(f"conv{last}a", narrow, wide, True), (f"conv{last}b", narrow, narrow, False)]

    def init(key: jax.Array) -> dict[str, Any]:
        k_proj, *k_convs, k_out = jax.random.split(key, len(convs) + 2)
        params = {"proj": _dense_init(k_proj, latent_dim, wide * h0 * w0, he=True)}
        for k, (name, c_out, c_in, _) in zip(k_convs, convs, strict=True):
            params[name] = _conv_init(k, c_out, c_in)
        return {**params, "out": _conv_init(k_out, image[2], narrow)}

    def apply(params: Any, z: jax.Array, dtype: Any = jnp.float32) -> jax.Array:
        p = _cast(params, dtype)
        h = act(z.astype(dtype) @ p["proj"]["w"] + p["proj"]["b"])
        h = h.reshape(h.shape[0], h0, w0, wide)
        for name, _, _, upsample in convs:
            h = act(_conv(_upsample(h) if upsample else h, p[name]["w"]) + p[name]["b"])
        return out(_conv(h, p["out"]["w"]) + p["out"]["b"]).astype(jnp.float32)

    return Model(init, apply)


def _layer_norm(h: jax.Array, p: dict[str, jax.Array], eps: float = 1e-6) -> jax.Array:
    """LayerNorm over the last (channel) axis of each token: statistics in float32, result in
    ``h``'s dtype."""
    f = h.astype(jnp.float32)
    mean = f.mean(-1, keepdims=True)
    var = jnp.square(f - mean).mean(-1, keepdims=True)
    out = ((f - mean) * jax.lax.rsqrt(var + eps)).astype(h.dtype)
    return out * p["scale"] + p["bias"]


def _patches(x: jax.Array, patch: int) -> jax.Array:
    """(B, H, W, C) -> (B, H/patch * W/patch, patch * patch * C): non-overlapping patches in
    row-major order, each flattened (row, column, channel). A reshape, not a strided conv."""
    b, h, w, c = x.shape
    x = x.reshape(b, h // patch, patch, w // patch, patch, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b, (h // patch) * (w // patch), patch * patch * c)


def _vit_block_init(key: jax.Array, width: int, hidden: int, depth: int) -> dict[str, Any]:
    """One pre-LN block: LeCun-normal q/k/v and MLP weights (He for the GELU layer), the two
    residual projections scaled down by sqrt(2 * depth) so the residual stream starts near its
    embedding's scale whatever the depth. Biases for the queries and values only: a key bias
    adds the same logit to every key of a query, which the softmax ignores, so its gradient is
    zero up to rounding, and Adam turns that rounding into lr-sized steps of random sign."""
    k_qkv, k_proj, k_fc1, k_fc2 = jax.random.split(key, 4)
    residual = 1.0 / math.sqrt(2 * depth)

    def dense(k: jax.Array, fan_in: int, fan_out: int, gain: float = 1.0) -> dict[str, Any]:
        w = gain / math.sqrt(fan_in) * jax.random.normal(k, (fan_in, fan_out), jnp.float32)
        return {"w": w, "b": jnp.zeros((fan_out,), jnp.float32)}

    ones, zeros = jnp.ones((width,), jnp.float32), jnp.zeros((width,), jnp.float32)
    return {
        "ln1": {"scale": ones, "bias": zeros},
        "qkv": {
            "w": dense(k_qkv, width, 3 * width)["w"],
            "b": jnp.zeros((2 * width,), jnp.float32),  # queries', then values'
        },
        "proj": dense(k_proj, width, width, residual),
        "ln2": {"scale": ones, "bias": zeros},
        "fc1": dense(k_fc1, width, hidden, math.sqrt(2.0)),
        "fc2": dense(k_fc2, hidden, width, residual),
    }


def vit_critic(
    width: int = 64,
    depth: int = 2,
    heads: int = 4,
    patch: int = 4,
    image: Image = (8, 8, 1),
    mlp_ratio: int = 2,
    attention: Callable[..., jax.Array] | None = None,
) -> Model:
    """A ViT critic for (B, H, W, C) = ``image`` (default the 8x8 digits): ``patch`` x ``patch``
    patches (by default 4 tokens of 4x4, as ``fastgp.train.recipes.defaults.VIT``) -> a linear
    embedding to ``width`` plus a learned position embedding -> ``depth`` pre-LN blocks (LayerNorm,
    ``heads``-head self-attention by ``attention`` (default ``fastgp.attention``, (B, T, H, D)
    arrays), residual; LayerNorm, a GELU MLP of ``mlp_ratio`` x ``width``, residual) -> a final
    LayerNorm -> the mean over the tokens -> a linear head -> (B,). No dropout, no batch norm, no
    class token."""
    height, side, channels = image
    if height % patch or side % patch or width % heads:
        raise ValueError(
            f"vit_critic: patch {patch} must divide the image's {height}x{side} and heads "
            f"{heads} the width {width}"
        )
    tokens, head_dim = (height // patch) * (side // patch), width // heads
    attend = fastgp.attention if attention is None else attention

    def init(key: jax.Array) -> dict[str, Any]:
        k_embed, k_pos, k_head, *k_blocks = jax.random.split(key, 3 + depth)
        fan_in = patch * patch * channels
        return {
            "embed": {
                "w": jax.random.normal(k_embed, (fan_in, width)) / math.sqrt(fan_in),
                "b": jnp.zeros((width,), jnp.float32),
            },
            "pos": 0.02 * jax.random.normal(k_pos, (tokens, width), jnp.float32),
            "blocks": [_vit_block_init(k, width, mlp_ratio * width, depth) for k in k_blocks],
            "ln": {"scale": jnp.ones((width,), jnp.float32), "bias": jnp.zeros((width,))},
            "out": _dense_init(k_head, width, 1, he=False),
        }

    def self_attention(y: jax.Array, blk: Any) -> jax.Array:
        b = y.shape[0]
        q_bias, v_bias = jnp.split(blk["qkv"]["b"], 2)
        bias = jnp.concatenate([q_bias, jnp.zeros_like(q_bias), v_bias])
        qkv = (y @ blk["qkv"]["w"] + bias).reshape(b, tokens, 3, heads, head_dim)
        out = attend(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]).reshape(b, tokens, width)
        return out @ blk["proj"]["w"] + blk["proj"]["b"]

    def apply(params: Any, x: jax.Array, dtype: Any = jnp.float32) -> jax.Array:
        p = _cast(params, dtype)
        h = _patches(x.astype(dtype), patch) @ p["embed"]["w"] + p["embed"]["b"] + p["pos"]
        for blk in p["blocks"]:
            h = h + self_attention(_layer_norm(h, blk["ln1"]), blk)
            y = jax.nn.gelu(_layer_norm(h, blk["ln2"]) @ blk["fc1"]["w"] + blk["fc1"]["b"])
            h = h + y @ blk["fc2"]["w"] + blk["fc2"]["b"]
        h = _layer_norm(h, p["ln"]).mean(axis=1)
        return (h @ p["out"]["w"] + p["out"]["b"])[:, 0].astype(jnp.float32)

    return Model(init, apply)


__all__ = [
    "ACTIVATIONS",
    "Image",
    "Model",
    "OUTPUTS",
    "conv_critic",
    "conv_generator",
    "generator_sides",
    "mlp",
    "vit_critic",
]
