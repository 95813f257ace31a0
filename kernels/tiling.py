"""Block sizes for the row-reduction kernels, chosen from each TPU generation's VMEM and bandwidth.

The kernels stream a (B, D) gradient through VMEM in (block_b, block_d) tiles. Two limits set the
tile size:

* large enough that the fixed cost of a grid step (about 0.35 us) is under ~10 % of the step's DMA
  time, i.e. ``bytes >= bandwidth * 3.5 us``;
* small enough that the backward kernel's working set fits in 3/4 of VMEM: input and output double
  buffered (4 tiles) plus up to 3 float32 temporaries of the same shape.

Unknown targets (ahead-of-time lowering from a CPU host, interpret mode) use the smallest budget of
any supported generation, which compiles everywhere.
"""

import dataclasses
import functools

import jax
import numpy as np
from jax.experimental.pallas import tpu as pltpu

LANES = 128
STEP_OVERHEAD_S = 0.35e-6
MAX_BLOCK_BYTES = 8 << 20  # keeps Mosaic's fully unrolled tile code small
MIN_BLOCK_BYTES = 512 << 10
MIN_TILE_WIDTH = 2048  # lanes a tile keeps before rows grow (fewer, longer DMA rows)
SUPPORTED_GENERATIONS = ("v4", "v5e", "v5p", "v6e", "7x")


@dataclasses.dataclass(frozen=True)
class Blocks:
    """A tiling of a (B, D) operand: tile shape and the scoped-VMEM limit to compile with."""

    block_b: int
    block_d: int
    vmem_limit_bytes: int


def _chip(generation: str):
    return pltpu.get_tpu_info_for_chip(pltpu.ChipVersion(generation), 1)


@functools.cache
def generation_budget(generation: str | None) -> tuple[int, int]:
    """(float32 tile bytes, scoped-VMEM limit) for a TPU generation name such as ``"v5e"``.

    ``None`` means "unknown target": the smallest tile of any supported generation.
    """
    if generation is None:
        return min(generation_budget(g) for g in SUPPORTED_GENERATIONS)
    info = _chip(generation)
    by_bandwidth = info.mem_bw_bytes_per_second * STEP_OVERHEAD_S * 10
    by_vmem = info.vmem_capacity_bytes * 3 // 4 // 7
    tile = int(np.clip(min(by_bandwidth, by_vmem), MIN_BLOCK_BYTES, MAX_BLOCK_BYTES))
    tile = 1 << (tile.bit_length() - 1)  # round down to a power of two
    return tile, info.vmem_capacity_bytes * 3 // 4


def current_generation() -> str | None:
    """Generation of the default device if it is a TPU, else None."""
    try:
        device = jax.devices()[0]
    except RuntimeError:
        return None
    if device.platform != "tpu":
        return None
    return pltpu.get_tpu_info().chip_version.value


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _sublanes(itemsize: int) -> int:
    return 8 * max(1, 4 // itemsize)


def choose_blocks(batch: int, features: int, itemsize: int, generation: str | None = None) -> Blocks:
    """Tile a (batch, features) operand of ``itemsize``-byte elements.

    ``block_b`` is the whole batch when ``batch <= 128`` (the per-sample outputs are lane-dense, so a
    partial batch block must be a multiple of 128). Larger batches get as many rows as the tile
    holds at a width of ``min(features, 2048)`` lanes, but at most half the batch, so a megacore
    has two row blocks to split. ``block_d`` is the whole feature axis when it fits, else a
    multiple of 128 that splits it into equal steps (12288 lanes on a 8192-lane budget become
    2 x 6144, not 8192 + 4096 with half a tile out of bounds); ragged tails are masked inside the
    kernels.
    """
    tile_bytes, vmem_limit = generation_budget(generation)
    if batch <= LANES:
        block_b = batch
    else:
        width = min(_round_up(features, LANES), MIN_TILE_WIDTH)
        by_tile = max(LANES, tile_bytes // (4 * width) // LANES * LANES)
        block_b = min(by_tile, _round_up(-(-batch // 2), LANES))
    rows = max(block_b, _sublanes(itemsize))
    lanes = max(LANES, tile_bytes // (4 * rows) // LANES * LANES)
    if features <= lanes:
        block_d = features
    else:  # as many steps as the budget needs, split evenly so the last tile is not mostly empty
        steps = -(-features // lanes)
        block_d = _round_up(-(-features // steps), LANES)
    return Blocks(block_b, block_d, vmem_limit)
