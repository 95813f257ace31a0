"""Pallas TPU kernels: per-sample sums of squares of a gradient leaf, read in its own layout.

Two views, each a layout XLA:TPU gives gradient leaves, so the operand is a bitcast of the leaf
rather than a relayout copy:

    row_sumsq(g)    g (B, D), batch along the sublanes (a dense layer's input-gradient);
    lane_sumsq(g)   g (..., S, B), batch along the lanes (a convolution's input-gradient, which
                    XLA:TPU stores spatial-major, channels in the sublanes, batch in the lanes).

Both return (B,) float32 sums over every other element, accumulated in float32 from bf16, f16 or
f32. Grid ``(P, K)``: P "parallel" (batch blocks; or, when one block holds the whole batch, the two
halves of the reduction, one per TensorCore of a megacore chip), K "arbitrary" (the reduction,
last). A float32 VMEM accumulator is zeroed at k == 0 and written lane-dense at k == last, one
(8, block_b) tile per parallel block; the halves are added outside. Ragged tails, and the repeated
last block of an odd split, are masked with ``broadcasted_iota`` + ``jnp.where`` (out-of-bounds
block contents are garbage, possibly NaN); ragged batch rows or lanes only reach discarded outputs.
"""

import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ..tiling import LANES, SUBLANES
from ..types import Interpret, Ref
from .tiling import Blocks


def _lane_partial_sums(x: jax.Array) -> jax.Array:
    """(rows, d) -> (rows, 128): sums over 128-lane slices; a narrower remainder lands in lane 0."""
    rows, d = x.shape
    out = jnp.zeros((rows, LANES), jnp.float32)
    for j in range(d // LANES):
        out = out + x[:, j * LANES : (j + 1) * LANES]
    if d % LANES:
        rest = jnp.sum(x[:, d - d % LANES :], axis=1, keepdims=True)
        lane = lax.broadcasted_iota(jnp.int32, out.shape, 1)
        out = out + jnp.where(lane == 0, rest, 0.0)
    return out


class _Grid:
    """Index arithmetic of the (P, K) grid shared by both kernels."""

    def __init__(self, batch: int, length: int, blocks: Blocks) -> None:
        self.batch_blocks = pl.cdiv(batch, blocks.batch)
        self.reduce_blocks = pl.cdiv(length, blocks.reduce)
        self.splits = blocks.splits
        self.steps = pl.cdiv(self.reduce_blocks, self.splits)
        self.shape = (self.batch_blocks * self.splits, self.steps)
        self.length, self.block = length, blocks.reduce
        # Mask when the last block is ragged or an odd split repeats it.
        self.masked = bool(length % blocks.reduce) or self.splits * self.steps != self.reduce_blocks

    # lax.div/rem, not // and %: jnp's floor division lowers through sign(), which Mosaic
    # lowers only when the compiling host is itself a TPU.
    def batch_block(self, q: jax.Array) -> jax.Array:
        return q if self.splits == 1 else lax.div(q, self.splits)

    def half(self, q: jax.Array) -> jax.Array | int:
        return 0 if self.splits == 1 else lax.rem(q, self.splits)

    def reduce_block(self, q: jax.Array, k: jax.Array) -> jax.Array:
        """The block read at (q, k): the split's k-th, clamped to the last one."""
        return jnp.minimum(self.half(q) * self.steps + k, self.reduce_blocks - 1)

    def valid(self, x: jax.Array, axis: int) -> jax.Array:
        """``x`` with the elements past the reduction length (along ``axis``) zeroed."""
        if not self.masked:
            return x
        start = (self.half(pl.program_id(0)) * self.steps + pl.program_id(1)) * self.block
        index = start + lax.broadcasted_iota(jnp.int32, x.shape, axis)
        return jnp.where(index < self.length, x, 0.0)


def _accumulate(
    acc_ref: Ref, out_ref: Ref, partial: jax.Array, finish: Callable[[jax.Array], jax.Array]
) -> None:
    k = pl.program_id(1)

    @pl.when(k == 0)
    def _init() -> None:
        acc_ref[...] = jnp.zeros_like(acc_ref)

    acc_ref[...] += partial

    @pl.when(k == pl.num_programs(1) - 1)
    def _finalize() -> None:
        out_ref[...] = jnp.broadcast_to(finish(acc_ref[...]), out_ref.shape)


def _rows_kernel(g_ref: Ref, out_ref: Ref, acc_ref: Ref, *, grid: _Grid) -> None:
    x = grid.valid(g_ref[...].astype(jnp.float32), axis=1)
    _accumulate(
        acc_ref,
        out_ref,
        _lane_partial_sums(x * x),
        lambda acc: jnp.sum(acc.T, axis=0, keepdims=True),
    )  # (1, block_b), lane-dense


def _lanes_kernel(g_ref: Ref, out_ref: Ref, acc_ref: Ref, *, grid: _Grid) -> None:
    x = grid.valid(g_ref[...].astype(jnp.float32), axis=0)
    _accumulate(
        acc_ref, out_ref, jnp.sum(x * x, axis=0), lambda acc: jnp.sum(acc, axis=0, keepdims=True)
    )


def _call(
    kernel: Callable[..., None],
    g: jax.Array,
    grid: _Grid,
    blocks: Blocks,
    in_block: tuple[int, ...],
    in_index: Callable[..., tuple[Any, ...]],
    acc_shape: tuple[int, int],
    interpret: Interpret,
) -> jax.Array:
    batch = g.shape[-1] if kernel is _lanes_kernel else g.shape[0]
    out = pl.pallas_call(
        functools.partial(kernel, grid=grid),
        out_shape=jax.ShapeDtypeStruct(
            (grid.splits, SUBLANES, batch),
            jnp.float32,
            manual_axis_type=jax.typeof(g).manual_axis_type,
        ),
        grid=grid.shape,
        in_specs=[pl.BlockSpec(in_block, in_index)],
        out_specs=pl.BlockSpec(
            (None, SUBLANES, blocks.batch), lambda q, k: (grid.half(q), 0, grid.batch_block(q))
        ),
        scratch_shapes=[pltpu.VMEM(acc_shape, jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary"), vmem_limit_bytes=blocks.vmem_limit_bytes
        ),
        cost_estimate=pl.CostEstimate(
            flops=2 * g.size,
            transcendentals=0,
            bytes_accessed=g.size * g.dtype.itemsize + grid.splits * SUBLANES * batch * 4,
        ),
        interpret=interpret,
    )(g)
    return jnp.sum(out[:, 0, :], axis=0)


@functools.partial(jax.jit, static_argnames=("blocks", "interpret"))
def row_sumsq(g: jax.Array, *, blocks: Blocks, interpret: Interpret = False) -> jax.Array:
    """Per-sample sums of squares of a (B, D) leaf stored row-major (batch along the sublanes).

    Args:
      g: (B, D) float array (f32, bf16, f16).
      blocks: the tiling (``tiling.row_blocks``).
      interpret: Pallas interpret mode (True or ``pltpu.InterpretParams``).

    Returns:
      (B,) float32.
    """
    batch, features = g.shape
    grid = _Grid(batch, features, blocks)
    return _call(
        _rows_kernel,
        g,
        grid,
        blocks,
        (blocks.batch, blocks.reduce),
        lambda q, k: (grid.batch_block(q), grid.reduce_block(q, k)),
        (blocks.batch, LANES),
        interpret,
    )


@functools.partial(jax.jit, static_argnames=("blocks", "interpret"))
def lane_sumsq(g: jax.Array, *, blocks: Blocks, interpret: Interpret = False) -> jax.Array:
    """Per-sample sums of squares of a leaf stored batch-minor: (..., S, B), batch along the lanes.

    The leading axes are merged into one (M, S, B) view, which keeps the tiled layout of the last
    two axes and so is free.

    Args:
      g: (..., S, B) float array (f32, bf16, f16), at least 2-D; B is the batch.
      blocks: the tiling (``tiling.lane_blocks``).
      interpret: Pallas interpret mode (True or ``pltpu.InterpretParams``).

    Returns:
      (B,) float32.
    """
    *lead, sublanes, batch = g.shape
    rows = math.prod(lead)
    view = g.reshape(rows, sublanes, batch)
    grid = _Grid(batch, rows, blocks)
    return _call(
        _lanes_kernel,
        view,
        grid,
        blocks,
        (blocks.reduce, sublanes, blocks.batch),
        lambda q, k: (grid.reduce_block(q, k), 0, grid.batch_block(q)),
        (sublanes, blocks.batch),
        interpret,
    )
