"""How the GPU sum-of-squares kernels split a (B, D) leaf's rows over programs.

    splits(batch, features, itemsize, programs) -> Split(chunk, chunks, spans)

A program sums one span of one row: ``chunks`` chunks of ``chunk`` features each (the last span
short where the row ends). Splitting the feature axis fills the device when the rows are few (one
program per row cannot: 64 rows against 132 SMs). Shared by the Triton kernel (``gpu``) and the
Mosaic GPU kernel (``mosaic_gpu``); this module imports no Pallas GPU backend.
"""

import dataclasses

from jax.experimental import pallas as pl

MAX_CHUNK = 4096


@dataclasses.dataclass(frozen=True)
class Split:
    """``chunk`` features a loop step, ``chunks`` steps a program, ``spans`` programs a row."""

    chunk: int
    chunks: int
    spans: int


def _chunk(features: int, itemsize: int) -> int:
    """Power-of-two chunk: the whole row up to 64 KiB of input, within [128, 4096] elements."""
    return min(max(pl.next_power_of_2(min(features, 65536 // itemsize)), 128), MAX_CHUNK)


def splits(batch: int, features: int, itemsize: int, programs: int) -> Split:
    """The chunk, and as many spans a row (each whole chunks) as bring the grid to at least
    ``programs`` programs, where the row has chunks for them."""
    chunk = _chunk(features, itemsize)
    row_chunks = pl.cdiv(features, chunk)
    wanted = min(row_chunks, max(1, pl.cdiv(programs, batch)))
    chunks = row_chunks // wanted  # at most: at least ``wanted`` spans
    return Split(chunk, chunks, pl.cdiv(row_chunks, chunks))


__all__ = ["MAX_CHUNK", "Split", "splits"]
