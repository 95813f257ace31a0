"""The forward kernel: online softmax over key blocks, with the log-sum-exp."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ..tiling import LANES
from ..types import Interpret, Ref
from . import layout as lo
from .tiles import NEG, accumulate, nt

_REFS = "q k v km o lse m l acc"


def _kernel(*refs: Ref, lay: lo.Layout, scale: float) -> None:
    r = lo.named(refs, _REFS)
    i, j = pl.program_id(2), pl.program_id(3)

    @pl.when(j == 0)
    def _init() -> None:
        r.m[...] = jnp.full(r.m.shape, NEG, jnp.float32)
        r.l[...] = jnp.zeros(r.l.shape, jnp.float32)
        r.acc[...] = jnp.zeros(r.acc.shape, jnp.float32)

    def _step() -> None:
        s = scale * nt(r.q[...], r.k[...])
        valid = lay.valid(r.km[...], i, j)
        m_prev = r.m[...]
        m_next = jnp.maximum(m_prev, jnp.max(jnp.where(valid, s, NEG), axis=1, keepdims=True))
        p = jnp.exp(jnp.where(valid, s - lo.lanes(m_next, lay.bk), NEG))
        alpha = jnp.exp(m_prev - m_next)
        r.l[...] = alpha * r.l[...] + lo.row_sums(p)
        r.m[...] = m_next
        r.acc[...] = r.acc[...] * lo.lanes(alpha, lay.dv) + accumulate(p, r.v[...])

    lo.when(lay.visits(i, j), _step)

    @pl.when(j == lay.nk - 1)
    def _finish() -> None:
        total = r.l[...]
        some = total > 0.0
        safe = jnp.where(some, total, 1.0)
        inv = jnp.where(some, 1.0 / safe, 0.0)
        r.o[...] = (r.acc[...] * lo.lanes(inv, lay.dv)).astype(r.o.dtype)
        r.lse[...] = lo.col_to_row(jnp.where(some, r.m[...] + jnp.log(safe), 0.0))


@functools.partial(jax.jit, static_argnames=lo.STATIC)
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
    lay = lo.layout(q, k, v, block_q, block_k, causal, q_offset)
    b, h = lay.batch, lay.heads
    call = lo.Call(
        kinds="qd kd kv km",
        out_kinds="qv qs",
        scratch=[
            *(pltpu.VMEM((lay.bq, LANES), jnp.float32),) * 2,
            pltpu.VMEM((lay.bq, lay.dv), jnp.float32),
        ],
        depth=lay.d + lay.dv,
        rescales=True,
    )
    out_shapes = (
        lo.out((b, h, lay.tq, lay.dv), q.dtype, q),
        lo.out((b, h, 1, lay.tq), jnp.float32, q),
    )
    kernel = functools.partial(_kernel, lay=lay, scale=scale)
    params = lo.compiler_params(vmem_limit_bytes)
    operands = (q, k, v, lo.key_rows(key_mask))
    o, lse = lo.tiled_call(kernel, lay, call, operands, out_shapes, params, interpret)
    return o, lse.reshape(b, h, lay.tq)
