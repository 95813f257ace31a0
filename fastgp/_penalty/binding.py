"""The penalty's backend binding: which implementation sums a gradient leaf's squares per sample.

    resolve_for(backend, *leaves)(leaf) -> (B,) float32 (float64 for a float64 leaf)

A leaf is a (B, ...) input-gradient. On TPU the kernels read it in the layout XLA gives it, so
that the kernel's operand is a bitcast of the leaf, not a relayout copy:

    (B, D)                          ``row_sumsq`` of the leaf as it is
    (B, C, H, W) or (B, H, W, C)    ``lane_sumsq`` of its (H, W, C, B) transpose: XLA:TPU stores a
    image, C the channel axis       convolution's input-gradient spatial-major, C in the sublanes,
                                    B in the lanes (measured on v4, v5e, v5p, v6e and TPU7x)
    any other leaf                  ``row_sumsq`` of its (B, D) reshape, a relayout copy

``"auto"`` resolves in ``fastgp._backends`` (XLA today). ``"pallas"`` runs the TPU kernels on every
leaf on TPU and a GPU kernel on CUDA (``fastgp._gpu.pallas.penalty_kernel``: Mosaic GPU where the
JAX has it and the GPU is Hopper or newer, else Triton), and fails to lower, with a ValueError
naming the alternatives, anywhere else, and on CUDA where the JAX has neither. ``"gpu-interpret"``
interprets the Triton kernel. Every kernel backend runs on each device's block of a sharded leaf
(``fastgp._penalty.sharding``); the TPU kernels tile for ``fastgp._backends.generation``, the GPU
kernels split each row to fill the GPU (``fastgp._gpu.tuned.penalty_programs``).
"""

import functools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from einops import rearrange
from jax import lax

from fastgp import _backends as backends
from fastgp._gpu import pallas as pallas_gpu
from fastgp._gpu import tuned as gpu_tuned
from fastgp._penalty.sharding import HOST_CALLBACKS, NO_TPU_PARTITIONER, BlockSumsq, per_device
from fastgp._penalty.xla import xla_sumsq
from fastgp._refusals import refuse_when_lowered
from fastgp._typing import Backend
from fastgp.kernels.penalty import spans, tiling
from fastgp.kernels.penalty import tpu as penalty_tpu

# --- Leaf views ---------------------------------------------------------------------------------


def image_channel_axis(shape: Sequence[int]) -> int | None:
    """1 (NCHW) or 3 (NHWC) for a (B, ., ., .) image whose channel axis is the smallest of the
    three and smaller than both spatial axes; None for any other shape."""
    if len(shape) != 4:
        return None
    _, first, middle, last = shape
    if first < min(middle, last):
        return 1
    if last < min(first, middle):
        return 3
    return None


def _as_rows(leaf: jax.Array) -> jax.Array:
    return rearrange(leaf, "b ... -> b (...)")


def _as_lanes(leaf: jax.Array, channel_axis: int) -> jax.Array:
    """(H, W, C, B): XLA:TPU's physical order for a convolution's input-gradient."""
    return rearrange(leaf, "b c h w -> h w c b" if channel_axis == 1 else "b h w c -> h w c b")


# --- Implementations ----------------------------------------------------------------------------


def _tpu_sumsq(backend: Backend) -> BlockSumsq:
    interpret = backends.interpret_mode(backend)

    def sumsq(leaf: jax.Array) -> jax.Array:
        generation = backends.generation(backend)
        axis = image_channel_axis(leaf.shape)
        if axis is not None:
            lanes = _as_lanes(leaf, axis)
            *lead, sublanes, batch = lanes.shape
            blocks = tiling.lane_blocks(math.prod(lead), sublanes, batch, generation)
            return penalty_tpu.lane_sumsq(lanes, blocks=blocks, interpret=interpret)
        rows = _as_rows(leaf)
        batch, features = rows.shape
        blocks = tiling.row_blocks(batch, features, rows.dtype.itemsize, generation)
        return penalty_tpu.row_sumsq(rows, blocks=blocks, interpret=interpret)

    return sumsq


def _gpu_sumsq(backend: Backend) -> BlockSumsq:
    """The GPU kernel that runs on the traced device (``"gpu-interpret"``: the Triton kernel in
    interpret mode), chosen when each leaf is traced; where this JAX has none, a stand-in whose
    lowering raises a ValueError naming what is missing."""
    interpret = backend == "gpu-interpret"

    def sumsq(leaf: jax.Array) -> jax.Array:
        kernel = "triton" if interpret else pallas_gpu.penalty_kernel(backends.traced_device())
        if kernel is None:
            message = pallas_gpu.missing_triton(
                f"backend={backend!r} on a GPU where fastgp's Mosaic GPU kernel does not run (it "
                f"needs Hopper or newer and JAX 0.11 or later)"
            )
            return refuse_when_lowered(xla_sumsq(leaf), message, "always")
        if kernel == "mosaic_gpu":
            module, rows = pallas_gpu.mosaic_penalty(), _as_rows(leaf)
        else:
            module, rows = pallas_gpu.triton_penalty(), pallas_gpu.deprecation_once(_as_rows(leaf))
        batch, features = rows.shape
        programs = gpu_tuned.penalty_programs()
        split = spans.splits(batch, features, rows.dtype.itemsize, programs)
        return module.row_sumsq(rows, split=split, interpret=interpret)

    return sumsq


def _unsupported(backend: Backend) -> BlockSumsq:
    """A stand-in whose lowering raises a ValueError naming the alternatives."""
    message = (
        f"backend={backend!r} runs the Pallas TPU or GPU kernels, but this program is being "
        f"lowered for another platform ({jax.default_backend()!r} by default). Use "
        f"backend='interpret' or 'tpu-interpret' to run the kernel on CPU, 'xla' for plain "
        f"JAX, or 'auto' (the default, XLA today)."
    )

    def unsupported(leaf: jax.Array) -> jax.Array:
        # Typed like the kernels' output in every sharding mode (manual axes inside shard_map,
        # the batch sharding under explicit axes), so that lax.platform_dependent accepts the
        # branch and the lowering is reached.
        return refuse_when_lowered(xla_sumsq(leaf), message, "always")

    return unsupported


def _per_platform(tpu: BlockSumsq, cuda: BlockSumsq, default: BlockSumsq) -> BlockSumsq:
    return lambda leaf: lax.platform_dependent(leaf, tpu=tpu, cuda=cuda, default=default)


@functools.cache
def resolve(backend: Backend) -> BlockSumsq:
    """The per-leaf sum of squares for a backend name; raises ValueError for an unknown name.

    Every kernel backend partitions itself (``fastgp._penalty.sharding``): under shard_map,
    explicit sharding and Auto-sharded ``jax.jit``, each device reduces its own block of the leaf.
    """
    backend = backends.resolve("penalty", backend)
    if backend == "xla":
        return xla_sumsq
    if backend == "interpret":
        return per_device(_tpu_sumsq(backend), backend)
    if backend == "tpu-interpret":
        return per_device(_tpu_sumsq(backend), backend, unpartitionable=HOST_CALLBACKS)
    if backend == "gpu-interpret":
        return per_device(_gpu_sumsq(backend), backend)
    return _per_platform(
        per_device(_tpu_sumsq(backend), backend, unpartitionable=NO_TPU_PARTITIONER),
        per_device(_gpu_sumsq(backend), backend),
        _unsupported(backend),
    )


def resolve_for(backend: Backend, *leaves: jax.Array) -> BlockSumsq:
    """The per-leaf sum of squares for ``backend`` on these leaves: float64 runs on XLA (the
    kernels accumulate in float32), which ``"auto"`` and ``"xla"`` allow and the kernel backends
    refuse."""
    wide = [leaf.dtype for leaf in leaves if jnp.dtype(leaf.dtype).itemsize > 4]
    if not wide:
        return resolve(backend)
    if backends.resolve("penalty", backend) == "xla":
        return xla_sumsq
    raise ValueError(
        f"backend={backend!r} runs kernels that accumulate in float32, but the "
        f"input has dtype {wide[0]}; use backend='auto' or 'xla' for float64, or "
        f"cast to float32"
    )


__all__ = ["image_channel_axis", "resolve", "resolve_for"]
