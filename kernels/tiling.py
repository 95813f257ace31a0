"""What every kernel family's tiling shares: TPU register geometry and the chips' figures.

Each op's ``tiling`` module (``penalty.tiling``, ``attention.tiling``) turns these into its own
``Blocks`` for a generation name such as ``"v5e"``; ``None`` stands for an unknown target (a
lowering whose device is not a TPU, interpret mode) and takes the smallest figures of any
supported chip.
"""

import functools

from jax.experimental.pallas import tpu as pltpu

LANES = 128
SUBLANES = 8
SUPPORTED_GENERATIONS = ("v4", "v5e", "v5p", "v6e", "7x")


@functools.cache
def chip_info(generation: str) -> pltpu.TpuInfo:
    """One chip's VMEM, bandwidth and MXU figures, as libtpu describes it."""
    return pltpu.get_tpu_info_for_chip(pltpu.ChipVersion(generation), 1)


def megacore(generation: str | None) -> bool:
    """Whether a chip of this generation runs one program on two TensorCores (unknown: yes)."""
    return generation is None or pltpu.ChipVersion(generation).supports_megacore


def round_up(n: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` that is at least ``n``."""
    return -(-n // multiple) * multiple


def sublane_packing(itemsize: int) -> int:
    """Rows per packed sublane tile: 8 for 32-bit, 16 for 16-bit elements."""
    return SUBLANES * max(1, 4 // itemsize)


__all__ = [
    "LANES",
    "SUBLANES",
    "SUPPORTED_GENERATIONS",
    "chip_info",
    "megacore",
    "round_up",
    "sublane_packing",
]
