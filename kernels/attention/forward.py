"""The forward kernel: online softmax over key blocks, with the log-sum-exp."""

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
    when,
)


def _forward_kernel(
    q_ref: Ref,
    k_ref: Ref,
    v_ref: Ref,
    km_ref: Ref,
    o_ref: Ref,
    lse_ref: Ref,
    m_ref: Ref,
    l_ref: Ref,
    acc_ref: Ref,
    *,
    lay: Layout,
    scale: float,
) -> None:
    i, j = pl.program_id(2), pl.program_id(3)

    @pl.when(j == 0)
    def _init() -> None:
        m_ref[...] = jnp.full(m_ref.shape, NEG, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    def _step() -> None:
        v = v_ref[...]
        s = scale * nt(q_ref[...], k_ref[...])
        valid = lay.valid(km_ref[...], i, j)
        m_prev = m_ref[...]
        m_next = jnp.maximum(m_prev, jnp.max(jnp.where(valid, s, NEG), axis=1, keepdims=True))
        p = jnp.exp(jnp.where(valid, s - lanes(m_next, lay.bk), NEG))
        alpha = jnp.exp(m_prev - m_next)
        l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=1, keepdims=True)
        m_ref[...] = m_next
        acc_ref[...] = acc_ref[...] * lanes(alpha, lay.dv) + nn(p.astype(v.dtype), v)

    when(lay.visits(i, j), _step)

    @pl.when(j == lay.nk - 1)
    def _finish() -> None:
        total = l_ref[...]
        some = total > 0.0
        safe = jnp.where(some, total, 1.0)
        inv = jnp.where(some, 1.0 / safe, 0.0)
        o_ref[...] = (acc_ref[...] * lanes(inv, lay.dv)).astype(o_ref.dtype)
        lse_ref[...] = col_to_row(jnp.where(some, m_ref[...] + jnp.log(safe), 0.0))


@functools.partial(jax.jit, static_argnames=STATIC)
def flash_forward(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    key_mask: jax.Array,
    *,
    scale: float,
    causal: bool,
    block_q: int,
    block_k: int,
    interpret: Interpret = False,
    vmem_limit_bytes: int | None = None,
    q_offset: int = 0,
) -> tuple[jax.Array, jax.Array]:
    """Attention forward with its log-sum-exp: online softmax over key blocks.

    Args:
      q, k, v: (B, H, Tq, D), (B, H, Tk, D), (B, H, Tk, Dv); f32, bf16 or f16.
      key_mask: (B, Tk) int32, 1 = valid key.
      scale: multiplies q.k. causal: query i sees key j only if j <= q_offset + i.
      block_q, block_k: must divide Tq and Tk (``tiling.blocks``).
      interpret: Pallas interpret mode (True or ``pltpu.InterpretParams``).
      q_offset: the first query's position among the keys (causal only; a sequence shard's
        start), 0 by default.
      vmem_limit_bytes: scoped-VMEM limit (``tiling.blocks(...).vmem_limit_bytes``; None: default).

    Returns:
      o (B, H, Tq, Dv) in q.dtype and lse (B, H, Tq) float32 (0 and 0 for rows with no valid key).
    """
    lay = layout(q, k, v, block_q, block_k, causal, q_offset)
    b, h = lay.batch, lay.heads
    o, lse = pl.pallas_call(
        functools.partial(_forward_kernel, lay=lay, scale=scale),
        out_shape=(
            out((b, h, lay.tq, lay.dv), q.dtype, q),
            out((b, h, 1, lay.tq), jnp.float32, q),
        ),
        grid=(b, h, lay.nq, lay.nk),
        in_specs=[
            q_rows(lay, lay.d),
            k_rows_streamed(lay, lay.d),
            k_rows_streamed(lay, lay.dv),
            k_mask_streamed(lay),
        ],
        out_specs=(q_rows(lay, lay.dv), q_stat(lay)),
        scratch_shapes=[
            pltpu.VMEM((lay.bq, LANES), jnp.float32),
            pltpu.VMEM((lay.bq, LANES), jnp.float32),
            pltpu.VMEM((lay.bq, lay.dv), jnp.float32),
        ],
        compiler_params=compiler_params(vmem_limit_bytes),
        cost_estimate=_cost(lay, q, k, v),
        interpret=interpret,
    )(q, k, v, key_rows(key_mask))
    return o, lse.reshape(b, h, lay.tq)


def _cost(lay: Layout, q: jax.Array, k: jax.Array, v: jax.Array) -> pl.CostEstimate:
    """The forward kernel's loop counts (see the package docstring)."""
    e = lay.elements()
    kv_bytes = lay.d * k.dtype.itemsize + lay.dv * v.dtype.itemsize
    return pl.CostEstimate(
        flops=2 * e * (lay.d + lay.dv),
        transcendentals=e + lay.streamed() * lay.bq,
        bytes_accessed=nbytes(q)
        + lay.streamed() * lay.bk * (kv_bytes + 4)
        + lay.batch * lay.heads * lay.tq * (lay.dv * q.dtype.itemsize + 4),
    )
