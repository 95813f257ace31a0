"""Block sizes for the attention kernels, chosen per TPU generation.

One (block_q, block_k) pair serves every kernel of the family (forward, tangent, VJP and the
second-order passes), so the caller pads Tq and Tk once. Three figures of the chip set it:

* ``block_q``, the rows that share one pass of K and V through VMEM: a forward step does
  ``2 * block_q * block_k * (D + Dv)`` flops on ``block_k * (D + Dv) * itemsize`` streamed bytes,
  so the kernel is compute-bound when ``2 * block_q / itemsize`` exceeds the chip's ridge point
  (bf16 flop/s over HBM bytes/s); ``block_q`` is the smallest multiple of the MXU width at twice
  that, between 256 and 1024 (bf16: v5e 512, v5p 384, v6e 1024, TPU7x 768; f32: 1024, v5p 768).
* ``block_k`` = 512 lanes of the score tile, which keeps the (block_q, block_k) float32 tile at
  most 2 MiB (Mosaic unrolls the block code per vreg) and a grid step (~0.35 us fixed cost) long.
* VMEM: the heaviest kernel (tangent_jvp: twelve streamed blocks, double-buffered, its f32
  scratch and ``TEMPORARIES`` live (block_q, block_k) float32 values) must fit in 2/3 of the
  scoped limit (3/4 of the core's VMEM), else the larger of block_q, block_k is halved (kept a
  multiple of 128): v4's 16 MiB gives bf16 (256, 512) and f32 (384, 256) at D <= 128.

Then each is fitted to its length: the whole length (rounded up to 128) when it fits in one
block, else the multiple of 128 from half the figure to the figure that pads the length least,
the larger on a tie (600 rows are two blocks of 384, not 512 + 88; 4,096 rows on TPU7x, whose
figure is 768, are eight blocks of 512, not six of 768 over 4,608). Half of ``block_q``'s figure
is about the chip's ridge point, so the kernel stays compute-bound where padding would add work.
A length under 128 is one block of the length rounded up to 16 (the sublane packing of bf16, and
the smallest tile of Triton's matmuls, so that the GPU kernels can walk the same padded arrays):
blocks equal to the (padded) array dims satisfy Mosaic's (8, 128) rule.

``generation=None`` (unknown target: a lowering whose device is not a TPU, interpret mode) takes
the smallest of each figure over the supported generations, which compiles on all of them.
"""

import dataclasses
import functools

from ..tiling import LANES, SUBLANES, SUPPORTED_GENERATIONS, chip_info, round_up, sublane_packing

MIN_BLOCK_Q = 256
MAX_BLOCK_Q = 1024
BLOCK_K = 512
TEMPORARIES = 8  # (block_q, block_k) float32 values live at once in the heaviest kernel
RIDGE_MARGIN = 2  # block_q at twice the ridge point: K/V streaming under half the compute time
GPU_MULTIPLE = 16  # a short length's block, so that the GPU kernels' tiles (>= 16) divide it


@dataclasses.dataclass(frozen=True)
class Blocks:
    """Query rows and key columns per block, and the scoped-VMEM limit to compile with."""

    block_q: int
    block_k: int
    vmem_limit_bytes: int


def vmem_bytes(block_q: int, block_k: int, d: int, itemsize: int) -> int:
    """VMEM tangent_jvp needs at these blocks (the family's largest), Dv = D assumed."""
    # q, o, dq, q_dot, o_dot, do_dot; k, v, dk, dv, k_dot, v_dot
    streamed = 2 * itemsize * (6 * block_q * d + 6 * block_k * d)
    rows = 2 * 4 * SUBLANES * (3 * block_q + block_k)  # lse, lse_dot, dlse_dot, key mask rows
    scratch = 4 * (block_q * d + 4 * block_q * LANES)
    return streamed + rows + scratch + TEMPORARIES * 4 * block_q * block_k


@functools.cache
def _generation_blocks(generation: str, itemsize: int, d: int) -> Blocks:
    info = chip_info(generation)
    granule = info.mxu_column_size
    ridge = info.bf16_ops_per_second / info.mem_bw_bytes_per_second
    block_q = round_up(int(RIDGE_MARGIN * ridge * itemsize / 2), granule)
    block_q = min(max(block_q, MIN_BLOCK_Q), MAX_BLOCK_Q)
    block_k = BLOCK_K
    limit = info.vmem_capacity_bytes * 3 // 4
    while vmem_bytes(block_q, block_k, d, itemsize) > limit * 2 // 3:
        if block_q > LANES and block_q >= block_k:
            block_q = max(LANES, block_q // 2 // LANES * LANES)
        elif block_k > LANES:
            block_k = max(LANES, block_k // 2 // LANES * LANES)
        else:
            break
    return Blocks(block_q, block_k, limit)


def _fit(length: int, target: int, itemsize: int) -> int:
    if length < LANES:
        return round_up(max(length, 1), max(GPU_MULTIPLE, sublane_packing(itemsize)))
    if length <= target:
        return round_up(length, LANES)
    smallest = max(LANES, round_up(target // 2, LANES))
    return min(range(smallest, target + 1, LANES), key=lambda b: (round_up(length, b), -b))


def blocks(tq: int, tk: int, d: int, dtype_itemsize: int, generation: str | None = None) -> Blocks:
    """Blocks for Tq queries and Tk keys of head dimension ``d`` (``dtype_itemsize``-byte inputs).

    The caller pads Tq up to a multiple of ``block_q`` and Tk up to one of ``block_k`` (marking
    the padded keys invalid in ``key_mask``). ``generation``: a TPU generation name such as
    ``"v5e"``, or None for an unknown target (the smallest blocks of any supported generation).
    """
    if generation is None:
        each = [_generation_blocks(g, dtype_itemsize, d) for g in SUPPORTED_GENERATIONS]
        target = Blocks(
            min(b.block_q for b in each),
            min(b.block_k for b in each),
            min(b.vmem_limit_bytes for b in each),
        )
    else:
        target = _generation_blocks(generation, dtype_itemsize, d)
    return Blocks(
        _fit(tq, target.block_q, dtype_itemsize),
        _fit(tk, target.block_k, dtype_itemsize),
        target.vmem_limit_bytes,
    )
