"""Pallas Mosaic GPU kernel with the contract of ``gpu.row_sumsq`` (Triton): per-sample sums of
squares of a (B, D) leaf, (B,) float32.

    row_sumsq(g, split=None, interpret=False) -> (B,) float32
        g: (B, D) float32, bfloat16 or float16, any D >= 1; split: ``spans.splits`` (None: one
        program a row); interpret: run in Mosaic GPU's interpret mode on CPU
        (``plgpu.InterpretGPUParams``). ValueError: a leaf of 2**31 elements or more.

The grid is (B, spans), one warpgroup a program: program (b, s) reads its span of row b from
global memory straight into registers, one chunk of features a loop step, squares in float32 and
accumulates, and writes one partial sum; the (B, spans) partials are then summed in float32.
Elementwise work with no reuse needs no shared memory, TMA or barriers, so none are used.

Rows start at arbitrary element offsets of the row-major leaf, so the loads are one element per
thread a step (a vector load from an unaligned row start would fault). A chunk window that would
run past the array's end is shifted back to end with it, and a mask keeps only the chunk's own
features of its own row: any D >= 1 works without padding the leaf (a leaf smaller than one chunk
is padded to it, a copy of under 16 KiB).

Needs a JAX whose ``jax.experimental.pallas.mosaic_gpu`` exports ``kernel`` and
``InterpretGPUParams`` (0.11 and later); Mosaic GPU targets Hopper (sm_90) and newer GPUs.
"""

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from .spans import Split, splits

MAX_ELEMENTS = 2**31  # flat indices are int32


def _span_sumsq_kernel(x_ref: Any, out_ref: Any, *, features: int, chunk: int, chunks: int) -> None:
    """out[row, span] = the float32 sum of squares of that span of the flat leaf's row."""
    row, span = lax.axis_index("row"), lax.axis_index("span")
    size = x_ref.shape[0]
    layout = plgpu.Layout.WG_STRIDED((chunk,), vec_size=1)
    row_start = row * features
    row_end = row_start + features
    first = span * chunks
    last = jnp.minimum(first + chunks, pl.cdiv(features, chunk))

    def body(i: jax.Array, acc: jax.Array) -> jax.Array:
        start = row_start + i * chunk
        window = jnp.minimum(start, size - chunk)  # never past the array's end
        # JAX >= 0.11's load; the type check reads 0.10.2's, which wants an index.
        ref = x_ref.at[pl.ds(window, chunk)]
        x = plgpu.load(ref, layout=layout).astype(jnp.float32)  # type: ignore[call-arg,unused-ignore]
        idx = window + plgpu.broadcasted_iota(jnp.int32, (chunk,), 0, layout=layout)
        own = jnp.logical_and(idx >= start, idx < row_end)
        return acc + jnp.where(own, x * x, 0.0)

    zeros = plgpu.layout_cast(jnp.zeros((chunk,), jnp.float32), layout)
    out_ref[row, span] = jnp.sum(lax.fori_loop(first, last, body, zeros))


@functools.partial(jax.jit, static_argnames=("split", "interpret"))
def row_sumsq(g: jax.Array, *, split: Split | None = None, interpret: bool = False) -> jax.Array:
    """(B,) float32 sums of squares of the rows of a (B, D) float array (f32, bf16, f16);
    ``split``: from ``spans.splits`` (None: one program a row)."""
    batch, features = g.shape
    if batch * features >= MAX_ELEMENTS:
        raise ValueError(
            f"the Mosaic GPU row_sumsq indexes the leaf with int32: a ({batch}, {features}) leaf "
            f"has {batch * features} elements, 2**31 or more; split it over devices or use the "
            f"XLA path (backend='xla')"
        )
    if split is None:
        split = splits(batch, features, g.dtype.itemsize, programs=1)
    flat = g.reshape(-1)
    if flat.shape[0] < split.chunk:
        flat = jnp.pad(flat, (0, split.chunk - flat.shape[0]))
    kernel = functools.partial(
        _span_sumsq_kernel, features=features, chunk=split.chunk, chunks=split.chunks
    )
    # JAX >= 0.11's interpret mode; the type check reads 0.10.2, which has none.
    interpret_params = plgpu.InterpretGPUParams() if interpret else None  # type: ignore[attr-defined,unused-ignore]
    partial_sums = plgpu.kernel(
        kernel,
        out_type=jax.ShapeDtypeStruct((batch, split.spans), jnp.float32),
        grid=(batch, split.spans),
        grid_names=("row", "span"),
        kernel_name="fastgp_row_sumsq",
        interpret=interpret_params,
    )(flat)
    # plgpu.kernel drops the manual axes the leaf varies over (inside shard_map): restore them.
    manual = getattr(jax.typeof(g), "manual_axis_type", None)
    varying = tuple(sorted(manual.varying)) if manual is not None else ()
    if varying:
        partial_sums = lax.pcast(partial_sums, varying, to="varying")
    return partial_sums.sum(axis=1)


__all__ = ["MAX_ELEMENTS", "row_sumsq"]
