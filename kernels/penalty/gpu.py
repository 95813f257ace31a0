"""Pallas GPU (Triton) kernel with the contract of ``penalty_tpu.row_sumsq``: per-sample sums of
squares of a (B, D) leaf, (B,) float32.

One program per sample row (``jax.vmap`` of a grid-less ``pallas_call`` adds the row grid, as in
JAX's own GPU layer norm). Each program walks its row in power-of-two chunks with masked loads,
accumulating in float32, so any D >= 1 works without padding. GPU arrays are row-major, so the
(B, D) view of a (B, ...) leaf is free.
"""

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

MAX_CHUNK = 4096


def _chunk(features: int, itemsize: int) -> int:
    """Power-of-two chunk: the whole row up to 64 KiB of input, within [128, 4096] elements."""
    return min(max(pl.next_power_of_2(min(features, 65536 // itemsize)), 128), MAX_CHUNK)


def _num_warps(chunk: int) -> int:
    return min(max(chunk // 256, 1), 8)


def _row_sumsq_kernel(x_ref: Any, sum_ref: Any, *, chunk: int) -> None:
    features = x_ref.shape[0]

    def body(i: jax.Array, acc: jax.Array) -> jax.Array:
        idx = i * chunk + jnp.arange(chunk)
        x = plgpu.load(x_ref.at[idx], mask=idx < features, other=0.0).astype(jnp.float32)
        return acc + x * x

    sum_ref[...] = lax.fori_loop(
        0, pl.cdiv(features, chunk), body, jnp.zeros(chunk, jnp.float32)
    ).sum()


@functools.partial(jax.jit, static_argnames=("interpret",))
def row_sumsq(g: jax.Array, *, interpret: bool = False) -> jax.Array:
    """(B,) float32 sums of squares of the rows of a (B, D) float array (f32, bf16, f16)."""
    chunk = _chunk(g.shape[1], g.dtype.itemsize)
    call = pl.pallas_call(
        functools.partial(_row_sumsq_kernel, chunk=chunk),
        out_shape=jax.ShapeDtypeStruct(
            (), jnp.float32, manual_axis_type=jax.typeof(g).manual_axis_type
        ),
        grid=(),
        compiler_params=plgpu.CompilerParams(num_warps=_num_warps(chunk)),
        interpret=interpret,
        name="fastgp_row_sumsq",
    )
    return jax.vmap(call)(g)
