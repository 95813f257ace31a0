"""Pallas GPU (Triton) kernels with the same contracts as ``penalty_tpu``: fused per-sample
norm + penalty, and per-sample row scaling.

One program per sample row (``jax.vmap`` of a grid-less ``pallas_call`` adds the row grid, as in
JAX's own GPU layer norm). Each program walks its row in power-of-two chunks with masked loads,
accumulating in float32, so any D >= 1 works without padding. The per-row scalars are stacked into
the same (8, B) float32 stats layout the TPU kernels use, so callers cannot tell them apart.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from .penalty_math import penalty_of_norm
from .stats_layout import STATS_ROWS, SUM_ROW

MAX_CHUNK = 4096


def _chunk(features: int, itemsize: int) -> int:
    """Power-of-two chunk: the whole row up to 64 KiB of input, within [128, 4096] elements."""
    return min(max(pl.next_power_of_2(min(features, 65536 // itemsize)), 128), MAX_CHUNK)


def _num_warps(chunk: int) -> int:
    return min(max(chunk // 256, 1), 8)


def _manual_axes(x):
    """Inside ``shard_map(check_vma=True)`` kernel outputs vary over the same axes as ``x``."""
    return jax.typeof(x).manual_axis_type


def _load_f32(ref, idx, mask):
    return plgpu.load(ref.at[idx], mask=mask, other=0.0).astype(jnp.float32)


def _row_sum_kernel(*refs, n_inputs, has_carry, kind, target, chunk):
    x_ref = refs[0]
    y_ref = refs[1] if n_inputs == 2 else None
    carry_ref = refs[n_inputs] if has_carry else None
    sum_ref, norm_ref, penalty_ref = refs[-3:]
    features = x_ref.shape[0]

    def body(i, acc):
        idx = i * chunk + jnp.arange(chunk)
        mask = idx < features
        x = _load_f32(x_ref, idx, mask)
        y = x if y_ref is None else _load_f32(y_ref, idx, mask)
        return acc + x * y

    total = lax.fori_loop(0, pl.cdiv(features, chunk), body, jnp.zeros(chunk, jnp.float32)).sum()
    if carry_ref is not None:
        total = total + carry_ref[...]
    sum_ref[...] = total
    if kind is None:
        norm_ref[...] = jnp.zeros_like(total)
        penalty_ref[...] = jnp.zeros_like(total)
    else:
        norm = jnp.sqrt(total)
        norm_ref[...] = norm
        penalty_ref[...] = penalty_of_norm(total, norm, kind, target)


@functools.partial(jax.jit, static_argnames=("kind", "target", "interpret"))
def row_stats(g, other=None, carry=None, *, kind=None, target=1.0, interpret=False):
    """Same contract as ``penalty_tpu.row_stats``: (B, D) in, (8, B) float32 stats out."""
    batch, features = g.shape
    chunk = _chunk(features, g.dtype.itemsize)
    scalar = jax.ShapeDtypeStruct((), jnp.float32, manual_axis_type=_manual_axes(g))
    call = pl.pallas_call(
        functools.partial(_row_sum_kernel, n_inputs=1 if other is None else 2,
                          has_carry=carry is not None, kind=kind, target=target, chunk=chunk),
        out_shape=(scalar, scalar, scalar),
        grid=(),
        compiler_params=plgpu.CompilerParams(num_warps=_num_warps(chunk)),
        interpret=interpret,
        name="fastgp_row_stats",
    )
    operands = [g] if other is None else [g, other]
    if carry is not None:
        operands.append(carry[SUM_ROW])
    rows = jax.vmap(call)(*operands)
    zeros = [jnp.zeros((batch,), jnp.float32)] * (STATS_ROWS - len(rows))
    return jnp.stack(list(rows) + zeros)


def _scale_row_kernel(scale_ref, g_ref, out_ref, *, chunk):
    features = g_ref.shape[0]
    scale = scale_ref[...]

    @pl.loop(0, pl.cdiv(features, chunk))
    def _(i):
        idx = i * chunk + jnp.arange(chunk)
        mask = idx < features
        out = scale * _load_f32(g_ref, idx, mask)
        plgpu.store(out_ref.at[idx], out.astype(out_ref.dtype), mask=mask)


@functools.partial(jax.jit, static_argnames=("out_dtype", "interpret"))
def scale_rows(scale, g, *, out_dtype=None, interpret=False):
    """Same contract as ``penalty_tpu.scale_rows``: ``scale[b] * g[b, :]`` in float32."""
    out_dtype = jnp.dtype(out_dtype or g.dtype)
    chunk = _chunk(g.shape[1], g.dtype.itemsize)
    call = pl.pallas_call(
        functools.partial(_scale_row_kernel, chunk=chunk),
        out_shape=jax.ShapeDtypeStruct((g.shape[1],), out_dtype, manual_axis_type=_manual_axes(g)),
        grid=(),
        compiler_params=plgpu.CompilerParams(num_warps=_num_warps(chunk)),
        interpret=interpret,
        name="fastgp_scale_rows",
    )
    return jax.vmap(call)(scale.astype(jnp.float32), g)


def row_dot(a, b, *, interpret=False):
    """(B,) float32 per-sample dot products."""
    return row_stats(a, b, interpret=interpret)[SUM_ROW]
