"""The attention passes on the Pallas kernels of ``fastgp.kernels.attention_tpu``.

Registered as the implementations of ``fastgp._attention_rules``'s primitives for the kernel
backends: ``"pallas"`` (Mosaic, on TPU), ``"interpret"`` (Pallas interpret mode) and
``"tpu-interpret"`` (``pltpu.InterpretParams``, which also simulates TPU memory). A ``"pallas"``
program lowered for any platform but TPU fails with a ValueError naming the alternatives.
"""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu

from fastgp import _attention_rules as rules
from fastgp.kernels import attention_tiling, attention_tpu
from fastgp.kernels.tiling import current_generation

KERNEL_BACKENDS = ("pallas", "interpret", "tpu-interpret")
_KERNELS: dict[str, Callable[..., Any]] = {
    "forward": attention_tpu.flash_forward,
    "tangent": attention_tpu.flash_tangent,
    "vjp": attention_tpu.flash_vjp,
}


def _generation(backend: str) -> str | None:
    return current_generation() if backend == "pallas" else None


def blocks(backend: str, tq: int, tk: int, d: int, itemsize: int) -> tuple[int, int]:
    """(block_q, block_k) of the kernels for this target (unknown target: the smallest)."""
    tiles = attention_tiling.flash_blocks(tq, tk, d, itemsize, _generation(backend))
    return tiles.block_q, tiles.block_k


def _interpret(backend: str) -> bool | pltpu.InterpretParams:
    if backend == "interpret":
        return True
    if backend == "tpu-interpret":
        return pltpu.InterpretParams()
    return False


def _impl(name: str, config: rules.Config) -> rules.Impl:
    kernel = _KERNELS[name]

    def run(*args: jax.Array) -> tuple[jax.Array, ...]:
        mask_at = 3 if name == "forward" else 5
        q, k = args[0], args[1]
        tiles = attention_tiling.flash_blocks(
            q.shape[2], k.shape[2], q.shape[3], q.dtype.itemsize, _generation(config.backend)
        )
        operands = list(args)
        operands[mask_at] = operands[mask_at].astype(jnp.int32)
        return tuple(
            kernel(
                *operands,
                scale=config.scale,
                causal=config.causal,
                block_q=config.block_q,
                block_k=config.block_k,
                interpret=_interpret(config.backend),
                vmem_limit_bytes=tiles.vmem_limit_bytes,
            )
        )

    return run


for _backend in KERNEL_BACKENDS:
    rules.register_kernel_backend(_backend, _impl)


__all__ = ["KERNEL_BACKENDS", "blocks"]
