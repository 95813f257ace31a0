"""Block sizes for the sum-of-squares kernels, chosen from each TPU generation's VMEM and bandwidth.

Two views of a gradient leaf are tiled (see ``tpu``):

* rows, (B, D): ``batch`` samples per block along the sublanes, ``reduce`` columns per step;
* lanes, (M, S, B): ``batch`` samples per block along the lanes, ``reduce`` rows of M per step.

Two limits set the block size: large enough that the fixed cost of a grid step (about 0.35 us)
is under ~10 % of the step's DMA time (``bytes >= bandwidth * 3.5 us``), and small enough that
the input (double-buffered) and its float32 temporaries, ``VMEM_TILES`` float32 blocks, fit in
3/4 of VMEM. The kernel asks for that much scoped VMEM (and 1 MiB), not for 3/4 of the core's:
with the larger request, XLA's compiled steps moved more bytes (docs/performance.md, "The toy
critics compiled for TPU").
When one block holds the whole batch, the reduction is split into two halves that the two
TensorCores of a megacore chip (v4, v5p) sum in parallel.

Unknown targets (a lowering whose device is not a TPU, interpret mode) use the smallest budget
of any supported generation, which compiles everywhere, and split as a megacore chip would.
"""

import dataclasses
import functools

import numpy as np

from ..tiling import (
    LANES,
    SUBLANES,
    SUPPORTED_GENERATIONS,
    chip_info,
    megacore,
    round_up,
    sublane_packing,
)

STEP_OVERHEAD_S = 0.35e-6
MAX_BLOCK_BYTES = 8 << 20  # keeps Mosaic's fully unrolled block code small
MIN_BLOCK_BYTES = 512 << 10
MIN_TILE_WIDTH = 2048  # lanes a rows block keeps before it grows rows (fewer, longer DMA rows)
VMEM_TILES = 7  # float32 blocks live at once: the input double-buffered and its temporaries


@dataclasses.dataclass(frozen=True)
class Blocks:
    """A tiling: samples per block, reduction length per step, parallel halves, VMEM limit."""

    batch: int
    reduce: int
    splits: int
    vmem_limit_bytes: int


@functools.cache
def generation_budget(generation: str | None) -> tuple[int, int]:
    """(float32 block bytes, scoped-VMEM limit) for a TPU generation name such as ``"v5e"``.

    ``None`` means "unknown target": the smallest block of any supported generation.
    """
    if generation is None:
        return min(generation_budget(g) for g in SUPPORTED_GENERATIONS)
    info = chip_info(generation)
    by_bandwidth = info.mem_bw_bytes_per_second * STEP_OVERHEAD_S * 10
    scoped = info.vmem_capacity_bytes * 3 // 4
    by_vmem = scoped // VMEM_TILES
    tile = int(np.clip(min(by_bandwidth, by_vmem), MIN_BLOCK_BYTES, MAX_BLOCK_BYTES))
    tile = 1 << (tile.bit_length() - 1)  # round down to a power of two
    return tile, min(scoped, VMEM_TILES * tile + (1 << 20))


def _even_split(length: int, limit: int, multiple: int) -> int:
    """The whole ``length`` if it fits in ``limit``, else equal steps of a ``multiple``."""
    if length <= limit:
        return length
    steps = -(-length // limit)
    return round_up(-(-length // steps), multiple)


def _splits(batch_blocks: int, reduce_blocks: int, generation: str | None) -> int:
    return 2 if batch_blocks == 1 and reduce_blocks >= 2 and megacore(generation) else 1


def row_blocks(batch: int, features: int, itemsize: int, generation: str | None = None) -> Blocks:
    """Tile a (batch, features) view of ``itemsize``-byte elements, batch along the sublanes.

    ``batch`` is the whole batch when it is at most 128 (per-sample outputs are lane-dense, so a
    partial batch block is a multiple of 128), else as many rows as the block holds at a width of
    ``min(features, 2048)`` lanes, at most half the batch (two blocks for a megacore).
    ``reduce`` is the whole feature axis when it fits, else equal steps of a multiple of 128.
    """
    tile_bytes, vmem_limit = generation_budget(generation)
    if batch <= LANES:
        block_b = batch
    else:
        width = min(round_up(features, LANES), MIN_TILE_WIDTH)
        by_tile = max(LANES, tile_bytes // (4 * width) // LANES * LANES)
        block_b = min(by_tile, round_up(-(-batch // 2), LANES))
    sublanes = sublane_packing(itemsize)
    lanes = max(LANES, tile_bytes // (4 * round_up(block_b, sublanes)) // LANES * LANES)
    block_d = _even_split(features, lanes, LANES)
    splits = _splits(-(-batch // block_b), -(-features // block_d), generation)
    return Blocks(block_b, block_d, splits, vmem_limit)


def lane_blocks(rows: int, sublanes: int, batch: int, generation: str | None = None) -> Blocks:
    """Tile a (rows, sublanes, batch) view, batch along the lanes, summed over rows and sublanes.

    ``batch`` is the whole batch up to 128 lanes, else 128 per block. ``reduce`` rows per step as
    the block budget allows (each row is a (sublanes, batch) tile padded to (8, 128) in float32),
    split into equal steps of a multiple of 8. (A bf16 or f16 (sublanes, lanes) tile in VMEM is
    no larger than its float32 upcast, so the float32 size bounds both.)
    """
    tile_bytes, vmem_limit = generation_budget(generation)
    block_b = batch if batch <= LANES else LANES
    row_bytes = round_up(sublanes, SUBLANES) * round_up(block_b, LANES) * 4
    block_m = _even_split(
        rows, max(SUBLANES, tile_bytes // row_bytes // SUBLANES * SUBLANES), SUBLANES
    )
    splits = _splits(-(-batch // block_b), -(-rows // block_m), generation)
    return Blocks(block_b, block_m, splits, vmem_limit)
