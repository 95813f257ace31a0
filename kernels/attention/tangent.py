"""The JVP kernel: the tangent of the output and of the log-sum-exp along (dq, dk, dv)."""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ..tiling import LANES
from ..types import Interpret, Ref
from . import layout as lo
from .tiles import Tiles, accumulate

_REFS = "q k v o lse km dq dk dv do dlse lse_col mu acc"


def _kernel(*refs: Ref, lay: lo.Layout, scale: float) -> None:
    r = lo.named(refs, _REFS)
    i, j = pl.program_id(2), pl.program_id(3)
    t = Tiles(scale)

    @pl.when(j == 0)
    def _init() -> None:
        r.lse_col[...] = lo.row_to_col(r.lse[...])
        r.mu[...] = jnp.zeros(r.mu.shape, jnp.float32)
        r.acc[...] = jnp.zeros(r.acc.shape, jnp.float32)

    def _step() -> None:
        q, k = r.q[...], r.k[...]
        lse = lo.lanes(r.lse_col[...], lay.bk)
        p = t.probabilities(q, k, lay.valid(r.km[...], i, j), lse)
        ps = p * t.along(q, k, r.dq[...], r.dk[...])
        r.mu[...] += lo.row_sums(ps)
        r.acc[...] += accumulate(ps, r.v[...]) + accumulate(p, r.dv[...])

    lo.when(lay.visits(i, j), _step)

    @pl.when(j == lay.nk - 1)
    def _finish() -> None:
        mu = r.mu[...]
        o = r.o[...].astype(jnp.float32)
        r.do[...] = (r.acc[...] - lo.lanes(mu, lay.dv) * o).astype(r.do.dtype)
        r.dlse[...] = lo.col_to_row(mu)


@functools.partial(jax.jit, static_argnames=lo.STATIC)
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
    lay = lo.layout(q, k, v, block_q, block_k, causal, q_offset)
    b, h = lay.batch, lay.heads
    call = lo.Call(
        kinds="qd kd kv qv qs km qd kd kv",
        out_kinds="qv qs",
        scratch=[
            *(pltpu.VMEM((lay.bq, LANES), jnp.float32),) * 2,
            pltpu.VMEM((lay.bq, lay.dv), jnp.float32),
        ],
        depth=3 * lay.d + 2 * lay.dv,
    )
    out_shapes = (
        lo.out((b, h, lay.tq, lay.dv), q.dtype, q),
        lo.out((b, h, 1, lay.tq), jnp.float32, q),
    )
    operands = (q, k, v, o, lo.stat_rows(lse), lo.key_rows(key_mask), dq, dk, dv)
    kernel = functools.partial(_kernel, lay=lay, scale=scale)
    params = lo.compiler_params(vmem_limit_bytes)
    do, dlse = lo.tiled_call(kernel, lay, call, operands, out_shapes, params, interpret)
    return do, dlse.reshape(b, h, lay.tq)
