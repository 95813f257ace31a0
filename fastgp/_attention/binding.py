"""Attention's backend binding: its passes on the Pallas kernels of ``fastgp.kernels.attention``.

Registered as the implementations of ``fastgp._attention.rules``'s primitives for the kernel
backends: ``"pallas"`` (Mosaic, on TPU), ``"interpret"`` (Pallas interpret mode) and
``"tpu-interpret"`` (``pltpu.InterpretParams``, which also simulates TPU memory). A ``"pallas"``
program lowered for any platform but TPU fails with a ValueError naming the alternatives
(``fastgp._attention.sharding``).
"""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from fastgp import _backends as backends
from fastgp._attention import rules
from fastgp._attention.config import Config
from fastgp._typing import Backend
from fastgp.kernels import attention as kernels

_KERNELS: dict[str, Callable[..., Any]] = {
    "forward": kernels.flash_forward,
    "tangent": kernels.flash_tangent,
    "vjp": kernels.flash_vjp,
    "tangent_jvp": kernels.flash_tangent_jvp,
    "vjp_jvp": kernels.flash_vjp_jvp,
    "second_vjp": kernels.flash_second_vjp,
}


def blocks(backend: Backend, tq: int, tk: int, d: int, itemsize: int) -> tuple[int, int]:
    """(block_q, block_k) of the kernels for this target (unknown target: the smallest)."""
    tiles = kernels.blocks(tq, tk, d, itemsize, backends.generation(backend))
    return tiles.block_q, tiles.block_k


def _impl(name: str, config: Config) -> rules.Impl:
    kernel = _KERNELS[name]

    def run(*args: jax.Array) -> tuple[jax.Array, ...]:
        mask_at = 3 if name == "forward" else 5
        q, k = args[0], args[1]
        tiles = kernels.blocks(
            q.shape[2],
            k.shape[2],
            q.shape[3],
            q.dtype.itemsize,
            backends.generation(config.backend),
        )
        operands = list(args)
        operands[mask_at] = operands[mask_at].astype(jnp.int32)
        return tuple(
            kernel(
                *operands,
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


for _backend in backends.OP_BACKENDS["attention"]:
    if _backend in backends.KERNEL_BACKENDS:
        rules.register_kernel_backend(_backend, _impl)


__all__ = ["blocks"]
