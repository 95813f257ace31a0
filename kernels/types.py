"""Type aliases every kernel family uses."""

from typing import Any, TypeAlias

from jax.experimental.pallas import tpu as pltpu

Ref: TypeAlias = Any  # a Pallas reference to a block in VMEM (or in HBM)
Interpret: TypeAlias = bool | pltpu.InterpretParams  # Pallas interpret mode: off, generic, or TPU

__all__ = ["Interpret", "Ref"]
