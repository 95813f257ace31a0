"""The VJP kernels: g_q over query blocks, g_k and g_v over key blocks (the tangent's transpose)."""

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
    compiler_params,
    k_mask,
    k_mask_streamed,
    k_rows,
    k_rows_streamed,
    key_rows,
    lanes,
    layout,
    nbytes,
    nn,
    nt,
    out,
    q_rows,
    q_rows_streamed,
    q_stat,
    q_stat_streamed,
    row_to_col,
    stat_rows,
    when,
)


def _dq_kernel(
    q_ref: Ref,
    k_ref: Ref,
    v_ref: Ref,
    lse_ref: Ref,
    c_ref: Ref,
    km_ref: Ref,
    go_ref: Ref,
    gq_ref: Ref,
    lse_col_ref: Ref,
    c_col_ref: Ref,
    acc_ref: Ref,
    *,
    lay: Layout,
    scale: float,
) -> None:
    i, j = pl.program_id(2), pl.program_id(3)

    @pl.when(j == 0)
    def _init() -> None:
        lse_col_ref[...] = row_to_col(lse_ref[...])
        c_col_ref[...] = row_to_col(c_ref[...])
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    def _step() -> None:
        k = k_ref[...]
        s = scale * nt(q_ref[...], k)
        valid = lay.valid(km_ref[...], i, j)
        p = jnp.exp(jnp.where(valid, s - lanes(lse_col_ref[...], lay.bk), NEG))
        dp = nt(go_ref[...], v_ref[...])
        ds = p * (dp - lanes(c_col_ref[...], lay.bk))
        acc_ref[...] += nn(ds.astype(k.dtype), k)

    when(lay.visits(i, j), _step)

    @pl.when(j == lay.nk - 1)
    def _finish() -> None:
        gq_ref[...] = (scale * acc_ref[...]).astype(gq_ref.dtype)


def _dkv_kernel(
    q_ref: Ref,
    k_ref: Ref,
    v_ref: Ref,
    lse_ref: Ref,
    c_ref: Ref,
    km_ref: Ref,
    go_ref: Ref,
    gk_ref: Ref,
    gv_ref: Ref,
    key_col_ref: Ref,
    acc_k_ref: Ref,
    acc_v_ref: Ref,
    *,
    lay: Layout,
    scale: float,
) -> None:
    j, i = pl.program_id(2), pl.program_id(3)

    @pl.when(i == 0)
    def _init() -> None:
        key_col_ref[...] = row_to_col((km_ref[...] != 0).astype(jnp.float32))
        acc_k_ref[...] = jnp.zeros(acc_k_ref.shape, jnp.float32)
        acc_v_ref[...] = jnp.zeros(acc_v_ref.shape, jnp.float32)

    def _step() -> None:
        q, go = q_ref[...], go_ref[...]
        s_t = scale * nt(k_ref[...], q)  # (bk, bq)
        valid = lay.valid_t(key_col_ref[...], j, i)
        p_t = jnp.exp(jnp.where(valid, s_t - lse_ref[...], NEG))
        acc_v_ref[...] += nn(p_t.astype(go.dtype), go)
        dp_t = nt(v_ref[...], go)
        ds_t = p_t * (dp_t - c_ref[...])
        acc_k_ref[...] += nn(ds_t.astype(q.dtype), q)

    when(lay.visits(i, j), _step)

    @pl.when(i == lay.nq - 1)
    def _finish() -> None:
        gk_ref[...] = (scale * acc_k_ref[...]).astype(gk_ref.dtype)
        gv_ref[...] = acc_v_ref[...].astype(gv_ref.dtype)


@functools.partial(jax.jit, static_argnames=STATIC)
def flash_vjp(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    o: jax.Array,
    lse: jax.Array,
    key_mask: jax.Array,
    g_o: jax.Array,
    g_lse: jax.Array,
    *,
    scale: float,
    causal: bool,
    block_q: int,
    block_k: int,
    interpret: Interpret = False,
    vmem_limit_bytes: int | None = None,
    q_offset: int = 0,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The VJP of ``flash_forward`` (the transpose of ``flash_tangent``) for cotangents g_o, g_lse.

    Two kernels: g_q over query blocks (key blocks last), g_k and g_v over key blocks (query
    blocks last). delta_i = g_o_i.o_i is computed here in float32 from the saved o and passed
    as the row statistic delta - g_lse.

    Returns:
      g_q, g_k, g_v in the dtypes of q, k, v. Arguments as ``flash_tangent``; g_o (B, H, Tq, Dv),
      g_lse (B, H, Tq).
    """
    lay = layout(q, k, v, block_q, block_k, causal, q_offset)
    delta = jnp.sum(g_o.astype(jnp.float32) * o.astype(jnp.float32), axis=-1)
    rows = (stat_rows(lse), stat_rows(delta - g_lse.astype(jnp.float32)), key_rows(key_mask))
    params = compiler_params(vmem_limit_bytes)
    operands = (q, k, v, *rows, g_o)
    g_q = _dq_call(operands, lay, scale, params, interpret)
    g_k, g_v = _dkv_call(operands, lay, scale, params, interpret)
    return g_q, g_k, g_v


def _dq_call(
    operands: tuple[jax.Array, ...],
    lay: Layout,
    scale: float,
    params: pltpu.CompilerParams,
    interpret: Interpret,
) -> jax.Array:
    """g_q over query blocks, the key blocks last; c = delta - g_lse as lane-dense rows."""
    q, k, v, _, _, _, g_o = operands  # q, k, v, lse rows, c rows, key rows, g_o
    b, h, e = lay.batch, lay.heads, lay.elements()
    kv_item = lay.d * k.dtype.itemsize + lay.dv * v.dtype.itemsize
    return pl.pallas_call(
        functools.partial(_dq_kernel, lay=lay, scale=scale),
        out_shape=out(q.shape, q.dtype, q),
        grid=(b, h, lay.nq, lay.nk),
        in_specs=[
            q_rows(lay, lay.d),
            k_rows_streamed(lay, lay.d),
            k_rows_streamed(lay, lay.dv),
            q_stat(lay),
            q_stat(lay),
            k_mask_streamed(lay),
            q_rows(lay, lay.dv),
        ],
        out_specs=q_rows(lay, lay.d),
        scratch_shapes=[
            pltpu.VMEM((lay.bq, LANES), jnp.float32),
            pltpu.VMEM((lay.bq, LANES), jnp.float32),
            pltpu.VMEM((lay.bq, lay.d), jnp.float32),
        ],
        compiler_params=params,
        cost_estimate=pl.CostEstimate(
            flops=2 * e * (2 * lay.d + lay.dv),
            transcendentals=e,
            bytes_accessed=2 * nbytes(q)
            + nbytes(g_o)
            + b * h * lay.tq * 8
            + lay.streamed() * lay.bk * (kv_item + 4),
        ),
        interpret=interpret,
    )(*operands)


def _dkv_call(
    operands: tuple[jax.Array, ...],
    lay: Layout,
    scale: float,
    params: pltpu.CompilerParams,
    interpret: Interpret,
) -> tuple[jax.Array, jax.Array]:
    """g_k and g_v over key blocks, the query blocks last (transposed score tiles)."""
    q, k, v, _, _, _, g_o = operands  # q, k, v, lse rows, c rows, key rows, g_o
    b, h, e = lay.batch, lay.heads, lay.elements()
    q_item, go_item = q.dtype.itemsize, g_o.dtype.itemsize
    g_k, g_v = pl.pallas_call(
        functools.partial(_dkv_kernel, lay=lay, scale=scale),
        out_shape=(out(k.shape, k.dtype, q), out(v.shape, v.dtype, q)),
        grid=(b, h, lay.nk, lay.nq),
        in_specs=[
            q_rows_streamed(lay, lay.d),
            k_rows(lay, lay.d),
            k_rows(lay, lay.dv),
            q_stat_streamed(lay),
            q_stat_streamed(lay),
            k_mask(lay),
            q_rows_streamed(lay, lay.dv),
        ],
        out_specs=(k_rows(lay, lay.d), k_rows(lay, lay.dv)),
        scratch_shapes=[
            pltpu.VMEM((lay.bk, LANES), jnp.float32),
            pltpu.VMEM((lay.bk, lay.d), jnp.float32),
            pltpu.VMEM((lay.bk, lay.dv), jnp.float32),
        ],
        compiler_params=params,
        cost_estimate=pl.CostEstimate(
            flops=2 * e * (2 * lay.d + 2 * lay.dv),
            transcendentals=e,
            bytes_accessed=2 * nbytes(k, v)
            + b * lay.tk * 4
            + lay.streamed() * lay.bq * (lay.d * q_item + lay.dv * go_item + 8),
        ),
        interpret=interpret,
    )(*operands)
    return g_k, g_v
