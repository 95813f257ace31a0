"""Backend resolution: which implementation computes a gradient leaf's per-sample sum of squares.

    resolve_for(backend, *leaves)(leaf) -> (B,) float32 (float64 for a float64 leaf)

A leaf is a (B, ...) input-gradient. On TPU the kernels read it in the layout XLA gives it, so
that the kernel's operand is a bitcast of the leaf, not a relayout copy:

    (B, D)                          ``row_sumsq`` of the leaf as it is
    (B, C, H, W) or (B, H, W, C)    ``lane_sumsq`` of its (H, W, C, B) transpose: XLA:TPU stores a
    image, C the channel axis       convolution's input-gradient spatial-major, C in the sublanes,
                                    B in the lanes (measured on v4, v5e, v5p, v6e and TPU7x)
    any other leaf                  ``row_sumsq`` of its (B, D) reshape, a relayout copy

``"auto"`` is XLA on every platform today; the measured critic steps behind that choice are in
``benchmarks/results/`` and ``docs/performance.md``. ``"pallas"`` runs the TPU kernels on every
leaf on TPU and the Triton kernel on CUDA, and fails to lower, with a ValueError naming the
alternatives, anywhere else. Every kernel backend runs on each device's block of a sharded leaf
(``fastgp._partitioning``).
"""

import functools
from collections.abc import Sequence
from typing import Any, NoReturn, get_args

import jax
import jax.numpy as jnp
from einops import rearrange
from jax import lax
from jax.experimental.pallas import tpu as pltpu
from jax.extend.core import Primitive
from jax.interpreters import mlir

from fastgp._partitioning import HOST_CALLBACKS, NO_TPU_PARTITIONER, BlockSumsq, per_device
from fastgp._typing import Backend
from fastgp.kernels import penalty_gpu, penalty_tpu

BACKENDS: tuple[Backend, ...] = get_args(Backend)


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


def xla_sumsq(leaf: jax.Array) -> jax.Array:
    """(B,) sums of squares over every non-batch axis, plain jnp, float32 (float64 for float64)."""
    x = leaf.astype(jnp.result_type(jnp.float32, leaf.dtype))
    return jnp.sum(x * x, axis=tuple(range(1, leaf.ndim)))


def _tpu_sumsq(interpret: bool | pltpu.InterpretParams) -> BlockSumsq:
    def sumsq(leaf: jax.Array) -> jax.Array:
        axis = image_channel_axis(leaf.shape)
        if axis is not None:
            return penalty_tpu.lane_sumsq(_as_lanes(leaf, axis), interpret=interpret)
        return penalty_tpu.row_sumsq(_as_rows(leaf), interpret=interpret)

    return sumsq


def _gpu_sumsq(interpret: bool) -> BlockSumsq:
    return lambda leaf: penalty_gpu.row_sumsq(_as_rows(leaf), interpret=interpret)


# A primitive whose only job is to fail, with a clear message, when lowered for a platform that
# the requested backend cannot run on. Tracing it is fine: lax.platform_dependent traces every
# branch but lowers only the ones for the platforms being compiled.
_unsupported_p = Primitive("fastgp_backend_unsupported")
_unsupported_p.def_abstract_eval(lambda x, *, message: x)


def _raise_on_lowering(ctx: Any, x: Any, *, message: str) -> NoReturn:
    raise ValueError(message)


mlir.register_lowering(_unsupported_p, _raise_on_lowering)


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
        return _unsupported_p.bind(xla_sumsq(leaf), message=message)

    return unsupported


def _per_platform(tpu: BlockSumsq, cuda: BlockSumsq, default: BlockSumsq) -> BlockSumsq:
    return lambda leaf: lax.platform_dependent(leaf, tpu=tpu, cuda=cuda, default=default)


@functools.cache
def resolve(backend: Backend) -> BlockSumsq:
    """The per-leaf sum of squares for a backend name; raises ValueError for an unknown name.

    Every kernel backend partitions itself (``fastgp._partitioning``): under shard_map, explicit
    sharding and Auto-sharded ``jax.jit``, each device reduces its own block of the leaf.
    """
    if backend in ("xla", "auto"):
        return xla_sumsq
    if backend == "interpret":
        return per_device(_tpu_sumsq(True), backend)
    if backend == "tpu-interpret":
        return per_device(
            _tpu_sumsq(pltpu.InterpretParams()), backend, unpartitionable=HOST_CALLBACKS
        )
    if backend == "gpu-interpret":
        return per_device(_gpu_sumsq(True), backend)
    if backend == "pallas":
        return _per_platform(
            per_device(_tpu_sumsq(False), backend, unpartitionable=NO_TPU_PARTITIONER),
            per_device(_gpu_sumsq(False), backend),
            _unsupported(backend),
        )
    raise ValueError(f"unknown backend {backend!r}; expected one of {BACKENDS}")


def resolve_for(backend: Backend, *leaves: jax.Array) -> BlockSumsq:
    """The per-leaf sum of squares for ``backend`` on these leaves: float64 runs on XLA (the
    kernels accumulate in float32), which ``"auto"`` and ``"xla"`` allow and the kernel backends
    refuse."""
    wide = [leaf.dtype for leaf in leaves if jnp.dtype(leaf.dtype).itemsize > 4]
    if not wide:
        return resolve(backend)
    if backend in ("auto", "xla"):
        return xla_sumsq
    raise ValueError(
        f"backend={backend!r} runs kernels that accumulate in float32, but the "
        f"input has dtype {wide[0]}; use backend='auto' or 'xla' for float64, or "
        f"cast to float32"
    )


__all__ = ["BACKENDS", "image_channel_axis", "resolve", "resolve_for", "xla_sumsq"]
