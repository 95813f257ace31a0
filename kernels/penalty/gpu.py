"""Pallas GPU (Triton) kernel with the contract of ``penalty_tpu.row_sumsq``: per-sample sums of
squares of a (B, D) leaf, (B,) float32.

The grid is (B, spans): program (b, s) sums one span of row b's features in power-of-two chunks
with masked loads, accumulating in float32, and writes one partial sum; the (B, spans) partials
are then summed in float32. Splitting the feature axis fills the device when the rows are few
(one program per row cannot: 64 rows against 132 SMs). ``jax.vmap`` of a ``pallas_call`` over the
spans adds the row axis, as in JAX's own GPU layer norm. Any D >= 1 works without padding. GPU
arrays are row-major, so the (B, D) view of a (B, ...) leaf is free.

``splits(batch, features, itemsize, programs)`` (``spans``, re-exported here) picks the chunk and
the spans for a device that runs ``programs`` programs at once; the caller passes them in.

JAX deprecates its Pallas Triton backend (since 0.11) and will remove it: this module imports
``jax.experimental.pallas.triton``, so fastgp imports it only on first use of a Triton kernel
(``fastgp._gpu.pallas``).
"""

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from .spans import MAX_CHUNK, Split, splits


def _num_warps(chunk: int) -> int:
    return min(max(chunk // 256, 1), 8)


def _span_sumsq_kernel(x_ref: Any, sum_ref: Any, *, chunk: int, chunks: int) -> None:
    features = x_ref.shape[0]
    first = pl.program_id(0) * chunks
    last = jnp.minimum(first + chunks, pl.cdiv(features, chunk))

    def body(i: jax.Array, acc: jax.Array) -> jax.Array:
        idx = i * chunk + jnp.arange(chunk)
        x = plgpu.load(x_ref.at[idx], mask=idx < features, other=0.0).astype(jnp.float32)
        return acc + x * x

    total = lax.fori_loop(first, last, body, jnp.zeros(chunk, jnp.float32)).sum()
    sum_ref[...] = jnp.full((1,), total, jnp.float32)


@functools.partial(jax.jit, static_argnames=("split", "interpret"))
def row_sumsq(g: jax.Array, *, split: Split | None = None, interpret: bool = False) -> jax.Array:
    """(B,) float32 sums of squares of the rows of a (B, D) float array (f32, bf16, f16);
    ``split``: from :func:`splits` (None: one program a row)."""
    if split is None:
        split = splits(g.shape[0], g.shape[1], g.dtype.itemsize, programs=1)
    manual = jax.typeof(g).manual_axis_type
    call = pl.pallas_call(
        functools.partial(_span_sumsq_kernel, chunk=split.chunk, chunks=split.chunks),
        out_shape=jax.ShapeDtypeStruct((split.spans,), jnp.float32, manual_axis_type=manual),
        grid=(split.spans,),
        in_specs=[pl.no_block_spec],
        out_specs=pl.BlockSpec((1,), lambda s: (s,)),
        compiler_params=plgpu.CompilerParams(num_warps=_num_warps(split.chunk)),
        interpret=interpret,
        name="fastgp_row_sumsq",
    )
    return jax.vmap(call)(g).sum(axis=1)


__all__ = ["MAX_CHUNK", "Split", "row_sumsq", "splits"]
