"""Per-sample float32 sums of squares of a gradient leaf, the penalty's one kernel family.

    tpu.row_sumsq(g, blocks=, interpret=)    g (B, D), batch along the sublanes -> (B,) float32
    tpu.lane_sumsq(g, blocks=, interpret=)   g (..., S, B), batch along the lanes -> (B,) float32
    gpu.row_sumsq(g, split=, interpret=)     g (B, D), Triton programs over spans of each row

``tiling`` sizes the TPU kernels' blocks for a generation (``row_blocks``, ``lane_blocks``), and
``gpu.splits`` the Triton kernel's spans for a number of programs; the caller passes them in.
"""

from .gpu import row_sumsq as gpu_row_sumsq
from .tiling import Blocks, generation_budget, lane_blocks, row_blocks
from .tpu import lane_sumsq, row_sumsq

__all__ = [
    "Blocks",
    "generation_budget",
    "gpu_row_sumsq",
    "lane_blocks",
    "lane_sumsq",
    "row_blocks",
    "row_sumsq",
]
