"""A zoo of per-sample critics for the benchmarks: the architectures GAN trainers penalise.

    resnet32      WGAN-GP's CIFAR-10 ResNet critic (Gulrajani et al. 2017, gan_cifar_resnet.py)
    dcgan32       DCGAN: 4x4 stride-2 convs (workloads.dcgan_critic, NHWC)
    lnconv32      3x3 stride-1 convs with LayerNorm and bilinear jax.image.resize downsampling
    stylegan2-64  StyleGAN2-style residual discriminator, R1 on reals
    vit32         a small ViT: 4x4 patches, pre-LN multi-head self-attention over one sample
    mlp           dense 3072 -> 512 -> 512 -> 512 -> 1 (workloads' mlp3072)

    ZOO_CPU[name], ZOO_TPU[name] -> workloads.CriticSpec

Every critic is ``Model(init, apply)``: float32 parameter pytrees; ``apply(params, x, dtype)``
casts parameters and input to ``dtype``, computes in it and returns (B,) float32 scores. Images
are NHWC with HWIO kernels. Nothing mixes samples (no batch norm, no minibatch statistics;
LayerNorm normalises each position of each sample over its channels, as Flax's does), which the
per-sample gradient penalty needs; tests/benchmarks/test_zoo.py checks it.
"""

import itertools
import math

import jax
import jax.numpy as jnp
from jax import lax

from benchmarks import workloads as W
from fastgp.train.models.networks import Model, mlp

_DN = ("NHWC", "HWIO", "NHWC")


def _cast(tree, dtype):
    return jax.tree.map(lambda a: a.astype(dtype), tree)


def _conv_init(key, k, c_in, c_out, gain=2.0, bias=True):
    """(k, k, c_in, c_out) kernel, std sqrt(gain / fan_in) (He for gain 2), zero bias."""
    w = math.sqrt(gain / (k * k * c_in)) * jax.random.normal(key, (k, k, c_in, c_out))
    return {"w": w, "b": jnp.zeros((c_out,), jnp.float32)} if bias else {"w": w}


def _dense_init(key, fan_in, fan_out, gain=2.0):
    w = math.sqrt(gain / fan_in) * jax.random.normal(key, (fan_in, fan_out))
    return {"w": w, "b": jnp.zeros((fan_out,), jnp.float32)}


def _ln_init(c):
    return {"scale": jnp.ones((c,), jnp.float32), "bias": jnp.zeros((c,), jnp.float32)}


def _conv(h, layer, stride=1, padding="SAME"):
    out = lax.conv_general_dilated(h, layer["w"], (stride, stride), padding, dimension_numbers=_DN)
    return out + layer["b"] if "b" in layer else out


def _layer_norm(h, p, eps=1e-6):
    """Over the last axis, statistics in float32 (as Flax computes them), result in h's dtype."""
    f = h.astype(jnp.float32)
    mean = f.mean(-1, keepdims=True)
    var = jnp.square(f - mean).mean(-1, keepdims=True)
    return ((f - mean) * lax.rsqrt(var + eps)).astype(h.dtype) * p["scale"] + p["bias"]


def _lrelu(h):
    return jax.nn.leaky_relu(h, 0.2)


# --- resnet32 ------------------------------------------------------------------------------------


def resnet32(channels: int = 128) -> Model:
    """The WGAN-GP paper's CIFAR-10 ResNet critic (no normalisation in the critic), (B, 32, 32, 3).

    Block 1 (the "optimized" first block): conv3x3 3->c, ReLU, conv3x3 c->c, 2x2 mean pool; the
    shortcut mean-pools then applies a 1x1 conv. Block 2 (down): ReLU, conv3x3, ReLU, conv3x3,
    mean pool; shortcut 1x1 conv then mean pool. Blocks 3 and 4: ReLU, conv3x3, ReLU, conv3x3 with
    the identity shortcut. Then ReLU, the spatial mean (8x8) and a linear layer.
    32 -> 16 -> 8 -> 8 -> 8."""
    c = channels

    def init(key):
        k = iter(jax.random.split(key, 12))
        block = lambda c_in: {
            "conv1": _conv_init(next(k), 3, c_in, c),
            "conv2": _conv_init(next(k), 3, c, c),
        }
        return {
            "b1": {**block(3), "skip": _conv_init(next(k), 1, 3, c, gain=1.0)},
            "b2": {**block(c), "skip": _conv_init(next(k), 1, c, c, gain=1.0)},
            "b3": block(c),
            "b4": block(c),
            "out": _dense_init(next(k), c, 1, gain=1.0),
        }

    def apply(params, x, dtype=jnp.float32):
        p = _cast(params, dtype)
        pool = W._mean_pool_2x2
        h = x.astype(dtype)
        b = p["b1"]
        h = _conv(pool(h), b["skip"]) + pool(_conv(jax.nn.relu(_conv(h, b["conv1"])), b["conv2"]))
        b = p["b2"]
        r = _conv(jax.nn.relu(_conv(jax.nn.relu(h), b["conv1"])), b["conv2"])
        h = pool(_conv(h, b["skip"])) + pool(r)
        for name in ("b3", "b4"):
            b = p[name]
            h = h + _conv(jax.nn.relu(_conv(jax.nn.relu(h), b["conv1"])), b["conv2"])
        h = jax.nn.relu(h).mean(axis=(1, 2))
        return (h @ p["out"]["w"] + p["out"]["b"])[:, 0].astype(jnp.float32)

    return Model(init, apply)


# --- lnconv32 ------------------------------------------------------------------------------------


def lnconv32(channels: int = 64, image: int = 32, in_channels: int = 1, blocks: int = 3) -> Model:
    """Stride-1 conv critic with LayerNorm and bilinear resizing, as in Flax NNX WGAN-GP examples:
    a 1x1 from-RGB conv, then per block LayerNorm, ``jax.image.resize`` to half the side
    (bilinear, antialiased: a 4-tap filter), a 3x3 stride-1 conv and LeakyReLU 0.2; a dense head.
    (B, 32, 32, 1): 32 -> 16 -> 8 -> 4."""
    c = channels
    side = image >> blocks

    def init(key):
        k = jax.random.split(key, blocks + 2)
        return {
            "rgb": _conv_init(k[0], 1, in_channels, c, gain=1.0),
            "blocks": [
                {"ln": _ln_init(c), "conv": _conv_init(k[i + 1], 3, c, c)} for i in range(blocks)
            ],
            "out": _dense_init(k[-1], side * side * c, 1, gain=1.0),
        }

    def apply(params, x, dtype=jnp.float32):
        p = _cast(params, dtype)
        h = _conv(x.astype(dtype), p["rgb"])
        for blk in p["blocks"]:
            h = _layer_norm(h, blk["ln"])
            b, height, width, ch = h.shape
            h = jax.image.resize(h, (b, height // 2, width // 2, ch), "bilinear")
            h = _lrelu(_conv(h, blk["conv"]))
        h = h.reshape(h.shape[0], -1)
        return (h @ p["out"]["w"] + p["out"]["b"])[:, 0].astype(jnp.float32)

    return Model(init, apply)


# --- stylegan2-64 --------------------------------------------------------------------------------


def _blur_down(h):
    """StyleGAN2's downsampling: the [1, 3, 3, 1] / 8 filter along H and W, padding 1, stride 2,
    written as strided slices (no convolution). (B, H, W, C) -> (B, H/2, W/2, C)."""
    for axis in (1, 2):
        n = h.shape[axis]
        pad = [(0, 0)] * h.ndim
        pad[axis] = (1, 1)
        p = jnp.pad(h, pad)
        tap = lambda start, p=p, n=n, axis=axis: lax.slice_in_dim(
            p, start, start + n - 1, stride=2, axis=axis
        )
        h = (tap(0) + tap(3) + 3 * (tap(1) + tap(2))) * 0.125
    return h


def stylegan2_64(widths: tuple = (32, 64, 128, 256, 256), image: int = 64) -> Model:
    """A StyleGAN2-style residual discriminator for (B, 64, 64, 3).

    ``widths[i]`` channels at side ``image / 2**i``. From-RGB 1x1 conv + LeakyReLU 0.2; per
    resolution 64, 32, 16, 8 a residual block: conv3x3 (c_in -> c_in), LeakyReLU, conv3x3
    (c_in -> c_out), LeakyReLU, blur-downsample; skip: blur-downsample then 1x1 conv (no bias);
    the sum times 1/sqrt(2). Epilogue at 4x4: conv3x3, LeakyReLU, dense (16 c -> c), LeakyReLU,
    dense -> 1. StyleGAN2's minibatch-stddev layer is left out: it mixes the samples of a group
    (a cross-sample statistic), and the per-sample penalty needs a per-sample critic. Equalised
    learning rates and the sqrt(2) activation gain are initialisation/optimiser details, left out.
    Penalised with R1 at the reals in the zoo (``kind="r1"``), as StyleGAN2 is.
    """
    n_blocks = len(widths) - 1
    side = image >> n_blocks

    def init(key):
        k = iter(jax.random.split(key, 3 * n_blocks + 4))
        blocks = [
            {
                "conv0": _conv_init(next(k), 3, c_in, c_in),
                "conv1": _conv_init(next(k), 3, c_in, c_out),
                "skip": _conv_init(next(k), 1, c_in, c_out, gain=1.0, bias=False),
            }
            for c_in, c_out in itertools.pairwise(widths)
        ]
        c = widths[-1]
        return {
            "rgb": _conv_init(next(k), 1, 3, widths[0]),
            "blocks": blocks,
            "conv": _conv_init(next(k), 3, c, c),
            "fc": _dense_init(next(k), side * side * c, c),
            "out": _dense_init(next(k), c, 1, gain=1.0),
        }

    def apply(params, x, dtype=jnp.float32):
        p = _cast(params, dtype)
        h = _lrelu(_conv(x.astype(dtype), p["rgb"]))
        for blk in p["blocks"]:
            skip = _conv(_blur_down(h), blk["skip"])
            h = _blur_down(_lrelu(_conv(_lrelu(_conv(h, blk["conv0"])), blk["conv1"])))
            h = (h + skip) * (1 / math.sqrt(2))
        h = _lrelu(_conv(h, p["conv"]))
        h = _lrelu(h.reshape(h.shape[0], -1) @ p["fc"]["w"] + p["fc"]["b"])
        return (h @ p["out"]["w"] + p["out"]["b"])[:, 0].astype(jnp.float32)

    return Model(init, apply)


# --- vit32 ---------------------------------------------------------------------------------------


def _vit_block_init(keys, dim: int) -> dict:
    """One pre-LN ViT block's parameters, drawing four keys from ``keys`` in turn."""
    return {
        "ln1": _ln_init(dim),
        "qkv": _dense_init(next(keys), dim, 3 * dim, gain=1.0),
        "proj": _dense_init(next(keys), dim, dim, gain=1.0),
        "ln2": _ln_init(dim),
        "fc1": _dense_init(next(keys), dim, 4 * dim),
        "fc2": _dense_init(next(keys), 4 * dim, dim, gain=1.0),
    }


def vit32(
    dim: int = 128,
    depth: int = 4,
    heads: int = 4,
    patch: int = 4,
    image: int = 32,
    in_ch: int = 3,
    attention_fn=None,
) -> Model:
    """A small ViT critic for (B, 32, 32, 3): a 4x4 stride-4 patch-embedding conv (64 patches),
    learned position embeddings, ``depth`` pre-LN blocks (multi-head self-attention over the
    patches of one sample, then a GELU MLP of width 4 ``dim``), a final LayerNorm, the mean over
    the patches and a dense head. Attention never crosses samples: the softmax runs over the
    patch axis of each sample."""
    tokens = (image // patch) ** 2
    head_dim = dim // heads

    def init(key):
        k = iter(jax.random.split(key, 4 * depth + 3))
        blocks = [_vit_block_init(k, dim) for _ in range(depth)]
        return {
            "embed": _conv_init(next(k), patch, in_ch, dim, gain=1.0),
            "pos": 0.02 * jax.random.normal(next(k), (tokens, dim)),
            "blocks": blocks,
            "ln": _ln_init(dim),
            "out": _dense_init(next(k), dim, 1, gain=1.0),
        }

    def attention(y, blk):
        b, n, _ = y.shape
        qkv = (y @ blk["qkv"]["w"] + blk["qkv"]["b"]).reshape(b, n, 3, heads, head_dim)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        if attention_fn is not None:
            out = attention_fn(q, k, v).reshape(b, n, dim)
            return out @ blk["proj"]["w"] + blk["proj"]["b"]
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) * (1 / math.sqrt(head_dim))
        weights = jax.nn.softmax(logits, axis=-1)
        out = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, n, dim)
        return out @ blk["proj"]["w"] + blk["proj"]["b"]

    def apply(params, x, dtype=jnp.float32):
        p = _cast(params, dtype)
        h = _conv(x.astype(dtype), p["embed"], stride=patch, padding="VALID")
        h = h.reshape(h.shape[0], tokens, dim) + p["pos"]
        for blk in p["blocks"]:
            h = h + attention(_layer_norm(h, blk["ln1"]), blk)
            y = _layer_norm(h, blk["ln2"])
            h = h + jax.nn.gelu(y @ blk["fc1"]["w"] + blk["fc1"]["b"]) @ blk["fc2"]["w"]
            h = h + blk["fc2"]["b"]
        h = _layer_norm(h, p["ln"]).mean(axis=1)
        return (h @ p["out"]["w"] + p["out"]["b"])[:, 0].astype(jnp.float32)

    return Model(init, apply)


# --- the zoo -------------------------------------------------------------------------------------

# name: (model, per-sample shape, penalty kind)
MODELS = {
    "resnet32": (resnet32(), (32, 32, 3), "wgan-gp"),
    "dcgan32": (W.dcgan_critic(64, 32, layout="NHWC"), (32, 32, 3), "wgan-gp"),
    "lnconv32": (lnconv32(), (32, 32, 1), "wgan-gp"),
    "stylegan2-64": (stylegan2_64(), (64, 64, 3), "r1"),
    "vit32": (vit32(), (32, 32, 3), "wgan-gp"),
    "mlp": (mlp([3072, 512, 512, 512, 1]), (3072,), "wgan-gp"),
}

SUMMARY = {
    "resnet32": "WGAN-GP CIFAR ResNet: optimized block 3->128 and a down block (mean-pool), two "
    "plain residual blocks, ReLU, spatial mean, linear; no normalisation",
    "dcgan32": "DCGAN: 4x4 stride-2 convs 64-128-256, LeakyReLU 0.2, linear",
    "lnconv32": "1x1 from-RGB 64; 3 x (LayerNorm, bilinear jax.image.resize 2x down, 3x3 conv, "
    "LeakyReLU); dense",
    "stylegan2-64": "StyleGAN2-style residual D, 32-64-128-256-256 channels, [1,3,3,1] blur "
    "downsampling, 1/sqrt(2) sums, no minibatch-stddev; 3x3 conv, dense, dense; R1 at the reals",
    "vit32": "ViT: 4x4 patches (64 tokens), dim 128, 4 pre-LN blocks of 4-head self-attention + "
    "GELU MLP 512, LayerNorm, mean over tokens, dense",
    "mlp": "dense 3072-512-512-512-1, ReLU",
}

# CPU batches: sized so that the plain critic step (no penalty) takes at most about 0.1-0.3 s on
# the 2-core benchmark machine, so that the six interleaved paths of a round (the naive step runs
# up to ~10x the plain one) take a few seconds and the zoo benchmark's rounds fit in minutes next
# to its compiles. Work per sample sets them: a plain step is ~3 GFLOP per sample for resnet32
# and ~5 for stylegan2-64 (batch 2), ~0.7 for vit32 (8), ~0.15 for dcgan32 and lnconv32 (16),
# ~0.02 for the MLP (256). benchmarks/results/zoo/zoo_cpu.md has the measured times.
CPU_BATCH = {
    "resnet32": 2,
    "dcgan32": 16,
    "lnconv32": 16,
    "stylegan2-64": 2,
    "vit32": 8,
    "mlp": 256,
}
# TPU batches: realistic per-chip batches for these models in bfloat16.
TPU_BATCH = {
    "resnet32": 64,
    "dcgan32": 64,
    "lnconv32": 64,
    "stylegan2-64": 32,
    "vit32": 64,
    "mlp": 256,
}


# Long-sequence ViT critics (4x4 patches, dim 256, 4 heads of 64, 2 pre-LN blocks) at 1024, 4096
# and 16384 tokens (128, 256 and 512 pixel images), with plain jnp attention or an attention_fn.
LONG_TOKENS = (1024, 4096, 16384)


def vit_long(tokens: int, attention_fn=None) -> Model:
    """The long-sequence ViT critic for (B, S, S, 3) images with (S / 4)^2 = ``tokens`` patches."""
    side = 4 * math.isqrt(tokens)
    return vit32(dim=256, depth=2, heads=4, image=side, attention_fn=attention_fn)


def long_spec(tokens: int, attention_fn=None, batch: int = 8, dtype=jnp.bfloat16):
    side = 4 * math.isqrt(tokens)
    name = f"vit-{tokens}"
    return W.CriticSpec(name, vit_long(tokens, attention_fn), batch, (side, side, 3), dtype)


def _spec(name, batch, dtype):
    model, shape, kind = MODELS[name]
    return W.CriticSpec(name, model, batch, shape, dtype, kind)


ZOO_CPU = {name: _spec(name, CPU_BATCH[name], jnp.float32) for name in MODELS}
ZOO_TPU = {name: _spec(name, TPU_BATCH[name], jnp.bfloat16) for name in MODELS}


def param_count(spec) -> int:
    shapes = jax.eval_shape(spec.model.init, jax.random.PRNGKey(0))
    return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(shapes))
