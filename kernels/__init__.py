"""Pallas kernels for per-sample gradient norms and penalties (installed as ``fastgp.kernels``).

Kernels only: no dispatch policy, no validation beyond what a kernel needs. The public API lives in
``fastgp.penalty``.
"""

from .penalty_math import KINDS, penalty_of_norm, penalty_slope
from .penalty_tpu import row_dot, row_stats, scale_rows
from .tiling import Blocks, choose_blocks, generation_budget

__all__ = [
    "KINDS",
    "Blocks",
    "choose_blocks",
    "generation_budget",
    "penalty_of_norm",
    "penalty_slope",
    "row_dot",
    "row_stats",
    "scale_rows",
]
