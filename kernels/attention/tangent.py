"""The JVP kernel: the tangent of the output and of the log-sum-exp along (dq, dk, dv)."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ..tiling import LANES
from ..types import Interpret, Ref
from .layout import (
    NEG,
    STATIC,
    Layout,
    col_to_row,
    compiler_params,
    k_mask_streamed,
    k_rows_streamed,
    key_rows,
    lanes,
    layout,
    nbytes,
    nn,
    nt,
    out,
    q_rows,
    q_stat,
    row_to_col,
    stat_rows,
    when,
)


def _tangent_kernel(
    q_ref: Ref,
    k_ref: Ref,
    v_ref: Ref,
    o_ref: Ref,
    lse_ref: Ref,
    km_ref: Ref,
    dq_ref: Ref,
    dk_ref: Ref,
    dv_ref: Ref,
    do_ref: Ref,
    dlse_ref: Ref,
    lse_col_ref: Ref,
    mu_ref: Ref,
    acc_ref: Ref,
    *,
    lay: Layout,
    scale: float,
) -> None:
    i, j = pl.program_id(2), pl.program_id(3)

    @pl.when(j == 0)
    def _init() -> None:
        lse_col_ref[...] = row_to_col(lse_ref[...])
        mu_ref[...] = jnp.zeros(mu_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    def _step() -> None:
        q, k, v, dv = q_ref[...], k_ref[...], v_ref[...], dv_ref[...]
        s = scale * nt(q, k)
        valid = lay.valid(km_ref[...], i, j)
        p = jnp.exp(jnp.where(valid, s - lanes(lse_col_ref[...], lay.bk), NEG))
        s_dot = scale * (nt(dq_ref[...], k) + nt(q, dk_ref[...]))
        ps = p * s_dot
        mu_ref[...] += jnp.sum(ps, axis=1, keepdims=True)
        acc_ref[...] += nn(ps.astype(v.dtype), v) + nn(p.astype(dv.dtype), dv)

    when(lay.visits(i, j), _step)

    @pl.when(j == lay.nk - 1)
    def _finish() -> None:
        mu = mu_ref[...]
        o = o_ref[...].astype(jnp.float32)
        do_ref[...] = (acc_ref[...] - lanes(mu, lay.dv) * o).astype(do_ref.dtype)
        dlse_ref[...] = col_to_row(mu)


@functools.partial(jax.jit, static_argnames=STATIC)
def flash_tangent(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    o: jax.Array,
    lse: jax.Array,
    key_mask: jax.Array,
    dq: jax.Array,
    dk: jax.Array,
    dv: jax.Array,
    *,
    scale: float,
    causal: bool,
    block_q: int,
    block_k: int,
    interpret: Interpret = False,
    vmem_limit_bytes: int | None = None,
    q_offset: int = 0,
) -> tuple[jax.Array, jax.Array]:
    """The JVP of ``flash_forward`` at (q, k, v) with its saved o, lse, along (dq, dk, dv).

    Returns:
      do (B, H, Tq, Dv) in q.dtype and dlse (B, H, Tq) float32. Arguments as ``flash_forward``;
      o, lse are its outputs, dq, dk, dv tangents shaped like q, k, v.
    """
    lay = layout(q, k, v, block_q, block_k, causal, q_offset)
    b, h = lay.batch, lay.heads
    do, dlse = pl.pallas_call(
        functools.partial(_tangent_kernel, lay=lay, scale=scale),
        out_shape=(
            out((b, h, lay.tq, lay.dv), q.dtype, q),
            out((b, h, 1, lay.tq), jnp.float32, q),
        ),
        grid=(b, h, lay.nq, lay.nk),
        in_specs=[
            q_rows(lay, lay.d),
            k_rows_streamed(lay, lay.d),
            k_rows_streamed(lay, lay.dv),
            q_rows(lay, lay.dv),
            q_stat(lay),
            k_mask_streamed(lay),
            q_rows(lay, lay.d),
            k_rows_streamed(lay, lay.d),
            k_rows_streamed(lay, lay.dv),
        ],
        out_specs=(q_rows(lay, lay.dv), q_stat(lay)),
        scratch_shapes=[
            pltpu.VMEM((lay.bq, LANES), jnp.float32),
            pltpu.VMEM((lay.bq, LANES), jnp.float32),
            pltpu.VMEM((lay.bq, lay.dv), jnp.float32),
        ],
        compiler_params=compiler_params(vmem_limit_bytes),
        cost_estimate=_cost(lay, q, k, v, o, dq, dk, dv),
        interpret=interpret,
    )(q, k, v, o, stat_rows(lse), key_rows(key_mask), dq, dk, dv)
    return do, dlse.reshape(b, h, lay.tq)


def _cost(lay: Layout, *arrays: jax.Array) -> pl.CostEstimate:
    """The tangent kernel's loop counts (see the package docstring) for q, k, v, o, dq, dk, dv."""
    q, k, v, o, dq, dk, dv = arrays
    e = lay.elements()
    kv_bytes = lay.d * (k.dtype.itemsize + dk.dtype.itemsize) + lay.dv * (
        v.dtype.itemsize + dv.dtype.itemsize
    )
    return pl.CostEstimate(
        flops=2 * e * (3 * lay.d + 2 * lay.dv),
        transcendentals=e,
        bytes_accessed=nbytes(q, o, dq)
        + lay.streamed() * lay.bk * (kv_bytes + 4)
        + lay.batch * lay.heads * lay.tq * (lay.dv * q.dtype.itemsize + 8),
    )
