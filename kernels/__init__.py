"""Pallas kernels for per-sample gradient sums of squares (installed as ``fastgp.kernels``).

Kernels only: no dispatch policy, no validation beyond what a kernel needs. The public API lives in
``fastgp.penalty``; ``penalty_math`` is the per-sample penalty as a function of the norm.
"""

from .attention_tiling import FlashBlocks, flash_blocks
from .attention_tpu import flash_forward, flash_tangent, flash_vjp
from .penalty_math import KINDS, Kind, penalty_of_norm, penalty_slope
from .penalty_tpu import lane_sumsq, row_sumsq
from .tiling import Blocks, generation_budget, lane_blocks, row_blocks

__all__ = [
    "KINDS",
    "Blocks",
    "FlashBlocks",
    "Kind",
    "flash_blocks",
    "flash_forward",
    "flash_tangent",
    "flash_vjp",
    "generation_budget",
    "lane_blocks",
    "lane_sumsq",
    "penalty_of_norm",
    "penalty_slope",
    "row_blocks",
    "row_sumsq",
]
