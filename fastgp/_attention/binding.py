"""Attention's backend binding: its passes on the Pallas kernels of ``fastgp.kernels.attention``.

``kernel_pass`` is the implementation of ``fastgp._attention.rules``'s primitives for the kernel
backends: ``"pallas"`` (Mosaic on TPU, Triton on GPU, chosen by the platform the program is
lowered for), ``"interpret"`` (the TPU kernels in Pallas interpret mode), ``"tpu-interpret"``
(``pltpu.InterpretParams``, which also simulates TPU memory) and ``"gpu-interpret"`` (the Triton
kernels in interpret mode). A ``"pallas"`` program lowered for any other platform fails with a
ValueError naming the alternatives, as does one lowered for CUDA under a JAX without Pallas Triton
(``fastgp._gpu.pallas``: the Triton kernels are imported on first use).

Both kernel families take the arrays as ``fastgp._attention.padded`` pads them (lengths to the
TPU blocks in ``Config``). The Triton kernels then walk them in power-of-two tiles that divide
those blocks (``gpu_blocks``; the largest tile edge, warps and stages per pass and head dim from
the traced GPU's tuned table, ``fastgp._gpu.tuned``), and need power-of-two head dims >= 16:
other head dims are padded with zero features here, which changes no score, and the results
sliced back.
"""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from fastgp import _backends as backends
from fastgp._attention import xla
from fastgp._attention.config import Config
from fastgp._gpu import pallas as pallas_gpu
from fastgp._gpu import tuned as gpu_tuned
from fastgp._refusals import refuse_when_lowered
from fastgp._typing import Backend
from fastgp.kernels import attention as kernels
from fastgp.kernels.attention import gpu_tiling

Impl = Callable[..., tuple[jax.Array, ...]]

_TPU_KERNELS: dict[str, Callable[..., Any]] = {
    "forward": kernels.flash_forward,
    "tangent": kernels.flash_tangent,
    "vjp": kernels.flash_vjp,
    "tangent_jvp": kernels.flash_tangent_jvp,
    "vjp_jvp": kernels.flash_vjp_jvp,
    "second_vjp": kernels.flash_second_vjp,
}
# The width of each 4-D result: "d" the head dim of q and k, "v" that of v; "s" a statistic.
_RESULT_WIDTHS = {
    "forward": "vs",
    "tangent": "vs",
    "vjp": "ddv",
    "tangent_jvp": "vs",
    "vjp_jvp": "ddv",
    "second_vjp": "ddvvs",
}
_OFF_PLATFORM_MESSAGE = (
    "fastgp.attention(backend='pallas') runs Pallas kernels on TPU (Mosaic) and GPU (Triton), "
    "but this program is being lowered for another platform. Use backend='interpret', "
    "'tpu-interpret' or 'gpu-interpret' to run the kernels on CPU, 'xla' for the blockwise jnp "
    "loops, or 'auto'."
)
_NO_TRITON_MESSAGE = pallas_gpu.missing_triton(
    "fastgp.attention(backend='pallas') on a GPU (its kernels are Triton kernels)",
    "backend='auto' or 'xla' (the blockwise jnp loops)",
)


def blocks(backend: Backend, tq: int, tk: int, d: int, itemsize: int) -> tuple[int, int]:
    """(block_q, block_k) of the kernels for this target (unknown target: the smallest)."""
    tiles = kernels.blocks(tq, tk, d, itemsize, backends.generation(backend))
    return tiles.block_q, tiles.block_k


def _tpu(name: str, config: Config) -> Impl:
    kernel = _TPU_KERNELS[name]

    def run(*args: jax.Array) -> tuple[jax.Array, ...]:
        q, k = args[0], args[1]
        generation = backends.generation(config.backend)
        tiles = kernels.blocks(q.shape[2], k.shape[2], q.shape[3], q.dtype.itemsize, generation)
        return tuple(
            kernel(
                *args,
                scale=config.scale,
                causal=config.causal,
                q_offset=config.q_offset,
                block_q=config.block_q,
                block_k=config.block_k,
                interpret=backends.interpret_mode(config.backend),
                vmem_limit_bytes=tiles.vmem_limit_bytes,
            )
        )

    return run


def _gpu_width(width: int) -> int:
    return max(16, pl.next_power_of_2(width))


def _pad_features(x: jax.Array, width: int) -> jax.Array:
    return jnp.pad(x, [(0, 0)] * 3 + [(0, width - x.shape[3])])


def _gpu(name: str, config: Config) -> Impl:
    if config.backend == "pallas" and not pallas_gpu.has_triton():
        return _refused(name, config, _NO_TRITON_MESSAGE)
    kernel = pallas_gpu.triton_attention().PASSES[name]

    def run(*args: jax.Array) -> tuple[jax.Array, ...]:
        q, v = args[0], args[2]
        d, dv = q.shape[3], v.shape[3]
        width = {d: _gpu_width(d), dv: _gpu_width(dv)}
        operands = [x if x.ndim != 4 else _pad_features(x, width[x.shape[3]]) for x in args]
        operands[0] = pallas_gpu.deprecation_once(operands[0])
        launch = gpu_tuned.attention_launch(name, max(width.values()))
        block_q, block_k = gpu_tiling.gpu_blocks(q.shape[2], args[1].shape[2], launch.block)
        results = kernel(
            *operands,
            scale=config.scale,
            causal=config.causal,
            q_offset=config.q_offset,
            block_q=block_q,
            block_k=block_k,
            interpret=config.backend == "gpu-interpret",
            num_warps=launch.num_warps,
            num_stages=launch.num_stages,
        )
        widths = {"d": d, "v": dv}
        return tuple(
            r if w == "s" else r[..., : widths[w]]
            for r, w in zip(results, _RESULT_WIDTHS[name], strict=True)
        )

    return run


def _refused(name: str, config: Config, message: str = _OFF_PLATFORM_MESSAGE) -> Impl:
    """The XLA pass, in a program whose lowering raises ``ValueError(message)``."""
    xla_pass = xla.PASSES[name]

    def run(*args: jax.Array) -> tuple[jax.Array, ...]:
        first, *rest = xla_pass(*args, config=config)
        return (refuse_when_lowered(first, message, "always"), *rest)

    return run


def kernel_pass(name: str, config: Config) -> Impl:
    """Pass ``name`` of ``fastgp._attention.rules`` on the kernels ``config.backend`` names:
    one of the kernel backends (``fastgp._backends.KERNEL_BACKENDS``)."""
    if config.backend in ("interpret", "tpu-interpret"):
        return _tpu(name, config)
    if config.backend == "gpu-interpret":
        return _gpu(name, config)
    tpu, cuda, default = _tpu(name, config), _gpu(name, config), _refused(name, config)
    return lambda *args: tuple(lax.platform_dependent(*args, tpu=tpu, cuda=cuda, default=default))


__all__ = ["Impl", "blocks", "kernel_pass"]
