"""Pallas TPU kernels: fused per-sample norm + penalty (forward) and per-sample row scaling (backward).

Every operand is a (B, D) view of a gradient (one pytree leaf, ``b ... -> b (...)``). Per-sample
results travel lane-dense as an (8, B) float32 "stats" array whose rows are

    row 0: sum of squares (or of products, for ``row_dot``)   row 1: norm   row 2: penalty

so a kernel writes full (8, block_b) tiles and the next kernel can read them back as its carry.

Forward grid ``(B / block_b, D / block_d)``: rows "parallel", the reduction over D last and
"arbitrary". Each step adds lane-partial sums of squares (VPU adds over 128-lane slices) into a
(block_b, 128) float32 accumulator; the last step reduces across lanes, transposes to a lane-dense
row and writes sum, norm and penalty. Ragged tails are masked with ``broadcasted_iota`` +
``jnp.where`` (out-of-bounds tile contents are undefined), so no padded copy of g is ever made.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from .penalty_math import penalty_of_norm
from .stats_layout import NORM_ROW, PENALTY_ROW, STATS_ROWS, SUM_ROW
from .tiling import LANES, Blocks, choose_blocks, current_generation



def _masked_f32(ref, k: int, features: int, block_d: int):
    """Load a tile as float32 with columns past ``features`` zeroed."""
    x = ref[...].astype(jnp.float32)
    if features % block_d:
        col = k * block_d + lax.broadcasted_iota(jnp.int32, x.shape, 1)
        x = jnp.where(col < features, x, 0.0)
    return x


def _lane_partial_sums(x):
    """(rows, d) -> (rows, 128): sums over 128-lane slices; a narrower remainder lands in lane 0."""
    rows, d = x.shape
    out = jnp.zeros((rows, LANES), jnp.float32)
    for j in range(d // LANES):
        out = out + x[:, j * LANES:(j + 1) * LANES]
    if d % LANES:
        rest = jnp.sum(x[:, d - d % LANES:], axis=1, keepdims=True)
        lane = lax.broadcasted_iota(jnp.int32, out.shape, 1)
        out = out + jnp.where(lane == 0, rest, 0.0)
    return out


def _row_stats_kernel(*refs, features, block_d, n_inputs, has_carry, kind, target):
    in_refs = refs[:n_inputs]
    carry_ref = refs[n_inputs] if has_carry else None
    out_ref, acc_ref = refs[-2], refs[-1]
    k = pl.program_id(1)

    @pl.when(k == 0)
    def _init():
        acc_ref[...] = jnp.zeros_like(acc_ref)

    x = _masked_f32(in_refs[0], k, features, block_d)
    y = x if n_inputs == 1 else _masked_f32(in_refs[1], k, features, block_d)
    acc_ref[...] += _lane_partial_sums(x * y)

    @pl.when(k == pl.num_programs(1) - 1)
    def _finalize():
        total = jnp.sum(acc_ref[...].T, axis=0, keepdims=True)  # (1, block_b), lane-dense
        if carry_ref is not None:
            total = total + carry_ref[SUM_ROW:SUM_ROW + 1, :]
        total = jnp.broadcast_to(total, out_ref.shape)
        row = lax.broadcasted_iota(jnp.int32, out_ref.shape, 0)
        if kind is None:
            out_ref[...] = jnp.where(row == SUM_ROW, total, 0.0)
            return
        norm = jnp.sqrt(total)
        penalty = penalty_of_norm(total, norm, kind, target)
        out_ref[...] = jnp.where(
            row == SUM_ROW, total,
            jnp.where(row == NORM_ROW, norm, jnp.where(row == PENALTY_ROW, penalty, 0.0)))


def _stats_shape(like, batch):
    return jax.ShapeDtypeStruct((STATS_ROWS, batch), jnp.float32,
                                manual_axis_type=jax.typeof(like).manual_axis_type)


def _resolve_blocks(g, blocks):
    if blocks is not None:
        return blocks
    return choose_blocks(g.shape[0], g.shape[1], g.dtype.itemsize, current_generation())


def _compiler_params(blocks: Blocks, semantics):
    return pltpu.CompilerParams(dimension_semantics=semantics,
                                vmem_limit_bytes=blocks.vmem_limit_bytes)


@functools.partial(jax.jit, static_argnames=("kind", "target", "blocks", "interpret"))
def row_stats(g, other=None, carry=None, *, kind=None, target=1.0, blocks=None, interpret=False):
    """Per-sample sums of ``g * other`` (``g * g`` when ``other`` is None), fused with norm/penalty.

    Args:
      g: (B, D) float array (f32, bf16, f16); accumulated in float32.
      other: optional (B, D) float array multiplied elementwise with g.
      carry: optional (8, B) float32 stats of earlier leaves; its row 0 is added to the sums.
      kind: penalty kind (see ``penalty_math``) or None for sums only.
      target, blocks, interpret: penalty target, tiling override, Pallas interpret mode/params.

    Returns:
      (8, B) float32: row 0 sum, row 1 norm, row 2 penalty (rows 1-2 zero when kind is None).
    """
    batch, features = g.shape
    blocks = _resolve_blocks(g, blocks)
    bb, bd = blocks.block_b, blocks.block_d
    operands = [g] if other is None else [g, other]
    tile = pl.BlockSpec((bb, bd), lambda i, k: (i, k))
    stats_tile = pl.BlockSpec((STATS_ROWS, bb), lambda i, k: (0, i))
    in_specs = [tile] * len(operands)
    if carry is not None:
        operands.append(carry)
        in_specs.append(stats_tile)
    kernel = functools.partial(
        _row_stats_kernel, features=features, block_d=bd, n_inputs=1 if other is None else 2,
        has_carry=carry is not None, kind=kind, target=target)
    bytes_in = sum(x.size * x.dtype.itemsize for x in operands)
    return pl.pallas_call(
        kernel,
        out_shape=_stats_shape(g, batch),
        grid=(pl.cdiv(batch, bb), pl.cdiv(features, bd)),
        in_specs=in_specs,
        out_specs=stats_tile,
        scratch_shapes=[pltpu.VMEM((bb, LANES), jnp.float32)],
        compiler_params=_compiler_params(blocks, ("parallel", "arbitrary")),
        cost_estimate=pl.CostEstimate(flops=2 * g.size, transcendentals=batch,
                                      bytes_accessed=bytes_in + STATS_ROWS * batch * 4),
        interpret=interpret,
    )(*operands)


def _scale_rows_kernel(scale_ref, g_ref, out_ref):
    column = jnp.transpose(scale_ref[...])[:, :1]  # (8, bb) lane-dense -> (bb, 1)
    out_ref[...] = (column * g_ref[...].astype(jnp.float32)).astype(out_ref.dtype)


@functools.partial(jax.jit, static_argnames=("out_dtype", "blocks", "interpret"))
def scale_rows(scale, g, *, out_dtype=None, blocks=None, interpret=False):
    """``out[b, :] = scale[b] * g[b, :]``: one read of g, one write, computed in float32.

    Args:
      scale: (B,) float32 per-sample factors.
      g: (B, D) float array.
      out_dtype: dtype of the result (default g's dtype).

    Returns:
      (B, D) array of ``out_dtype``.
    """
    batch, features = g.shape
    out_dtype = jnp.dtype(out_dtype or g.dtype)
    blocks = _resolve_blocks(g, blocks)
    bb, bd = blocks.block_b, blocks.block_d
    scale_rows8 = jnp.broadcast_to(scale.astype(jnp.float32)[None, :], (STATS_ROWS, batch))
    tile = pl.BlockSpec((bb, bd), lambda i, k: (i, k))
    return pl.pallas_call(
        _scale_rows_kernel,
        out_shape=jax.ShapeDtypeStruct(g.shape, out_dtype,
                                       manual_axis_type=jax.typeof(g).manual_axis_type),
        grid=(pl.cdiv(batch, bb), pl.cdiv(features, bd)),
        in_specs=[pl.BlockSpec((STATS_ROWS, bb), lambda i, k: (0, i)), tile],
        out_specs=tile,
        compiler_params=_compiler_params(blocks, ("parallel", "parallel")),
        cost_estimate=pl.CostEstimate(
            flops=g.size, transcendentals=0,
            bytes_accessed=g.size * (g.dtype.itemsize + out_dtype.itemsize)
            + STATS_ROWS * batch * 4),
        interpret=interpret,
    )(scale_rows8, g)


def row_dot(a, b, *, blocks=None, interpret=False):
    """(B,) float32 per-sample dot products ``sum_d a[b, d] * b[b, d]`` (float32 accumulation)."""
    return row_stats(a, b, blocks=blocks, interpret=interpret)[SUM_ROW]
