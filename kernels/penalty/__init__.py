"""Per-sample float32 sums of squares of a gradient leaf, the penalty's one kernel family.

    tpu.row_sumsq(g, blocks=, interpret=)    g (B, D), batch along the sublanes -> (B,) float32
    tpu.lane_sumsq(g, blocks=, interpret=)   g (..., S, B), batch along the lanes -> (B,) float32
    gpu.row_sumsq(g, split=, interpret=)     g (B, D), Triton programs over spans of each row
    mosaic_gpu.row_sumsq(g, split=, interpret=)   the same contract on Mosaic GPU

``tiling`` sizes the TPU kernels' blocks for a generation (``row_blocks``, ``lane_blocks``), and
``spans.splits`` the GPU kernels' spans for a number of programs; the caller passes them in.
The GPU kernel modules are not imported here: each needs a Pallas GPU backend that a given JAX
may lack (JAX deprecates Triton since 0.11), so they are imported where they are used.
"""

from .tiling import Blocks, generation_budget, lane_blocks, row_blocks
from .tpu import lane_sumsq, row_sumsq

__all__ = [
    "Blocks",
    "generation_budget",
    "lane_blocks",
    "lane_sumsq",
    "row_blocks",
    "row_sumsq",
]
