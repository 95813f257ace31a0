"""The tangent's derivative along its primal inputs: how (do, dlse) move when (q, k, v, o, lse)
move along (q_dot, k_dot, v_dot, o_dot, lse_dot), the tangent (dq, dk, dv) held fixed.

One query-major kernel. With the tangent's Sdot = scale (dq k^T + q dk^T), S' = scale (q_dot k^T
+ q k_dot^T), Sdot' = scale (dq k_dot^T + q_dot dk^T) and P' = P (S' - lse_dot):
    M = P' Sdot + P Sdot',  mu = sum_j P Sdot,  mu' = sum_j M,
    do' = sum_j (M v + P' dv + P Sdot v_dot) - mu' o - mu o_dot,   dlse' = mu'.
"""

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ..tiling import LANES
from ..types import Interpret, Ref
from . import layout as lo
from . import tiles
from .tiles import Tiles, accumulate

_REFS = (
    "q k v o lse km dq dk dv q_dot k_dot v_dot o_dot lse_dot"  # operands
    " do_dot dlse_dot"  # outputs
    " lse_col lse_dot_col mu mu_dot acc"  # scratch
)


def _kernel(*refs: Ref, lay: lo.Layout, scale: float) -> None:
    r = lo.named(refs, _REFS)
    i, j = pl.program_id(2), pl.program_id(3)
    t = Tiles(scale)

    @pl.when(j == 0)
    def _init() -> None:
        r.lse_col[...] = lo.row_to_col(r.lse[...])
        r.lse_dot_col[...] = lo.row_to_col(r.lse_dot[...])
        for acc in (r.mu, r.mu_dot, r.acc):
            acc[...] = jnp.zeros(acc.shape, jnp.float32)

    def _step() -> None:
        q, k = r.q[...], r.k[...]
        lse, lse_dot = (lo.lanes(col[...], lay.bk) for col in (r.lse_col, r.lse_dot_col))
        p = t.probabilities(q, k, lay.valid(r.km[...], i, j), lse)
        ps, m, p_prime = tiles.tangent_jvp(
            t, p, q, k, r.dq[...], r.dk[...], r.q_dot[...], r.k_dot[...], lse_dot
        )
        r.mu[...] += lo.row_sums(ps)
        r.mu_dot[...] += lo.row_sums(m)
        r.acc[...] += (
            accumulate(m, r.v[...]) + accumulate(p_prime, r.dv[...]) + accumulate(ps, r.v_dot[...])
        )

    lo.when(lay.visits(i, j), _step)

    @pl.when(j == lay.nk - 1)
    def _finish() -> None:
        mu, mu_dot = lo.lanes(r.mu[...], lay.dv), lo.lanes(r.mu_dot[...], lay.dv)
        o, o_dot = r.o[...].astype(jnp.float32), r.o_dot[...].astype(jnp.float32)
        r.do_dot[...] = (r.acc[...] - mu_dot * o - mu * o_dot).astype(r.do_dot.dtype)
        r.dlse_dot[...] = lo.col_to_row(r.mu_dot[...])


@functools.partial(jax.jit, static_argnames=lo.STATIC)
def flash_tangent_jvp(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    o: jax.Array,
    lse: jax.Array,
    key_mask: jax.Array,
    dq: jax.Array,
    dk: jax.Array,
    dv: jax.Array,
    q_dot: jax.Array,
    k_dot: jax.Array,
    v_dot: jax.Array,
    o_dot: jax.Array,
    lse_dot: jax.Array,
    *,
    scale: float,
    causal: bool,
    block_q: int,
    block_k: int,
    interpret: Interpret = False,
    vmem_limit_bytes: int | None = None,
    q_offset: int = 0,
) -> tuple[jax.Array, jax.Array]:
    """The derivative of ``flash_tangent``'s (do, dlse) along its primal inputs.

    Arguments as ``flash_tangent``, then q_dot, k_dot, v_dot, o_dot (shaped like q, k, v, o) and
    lse_dot (B, H, Tq) float32: the direction of (q, k, v, o, lse).

    Returns:
      do_dot (B, H, Tq, Dv) in q.dtype and dlse_dot (B, H, Tq) float32.
    """
    lay = lo.layout(q, k, v, block_q, block_k, causal, q_offset)
    b, h = lay.batch, lay.heads
    call = lo.Call(
        kinds="qd kd kv qv qs km qd kd kv qd kd kv qv qs",
        out_kinds="qv qs",
        scratch=[
            *(pltpu.VMEM((lay.bq, LANES), jnp.float32),) * 4,
            pltpu.VMEM((lay.bq, lay.dv), jnp.float32),
        ],
        depth=7 * lay.d + 3 * lay.dv,
    )
    out_shapes = (
        lo.out((b, h, lay.tq, lay.dv), q.dtype, q),
        lo.out((b, h, 1, lay.tq), jnp.float32, q),
    )
    operands = (
        *(q, k, v, o, lo.stat_rows(lse), lo.key_rows(key_mask), dq, dk, dv),
        *(q_dot, k_dot, v_dot, o_dot, lo.stat_rows(lse_dot)),
    )
    kernel = functools.partial(_kernel, lay=lay, scale=scale)
    params = lo.compiler_params(vmem_limit_bytes)
    do_dot, dlse_dot = lo.tiled_call(kernel, lay, call, operands, out_shapes, params, interpret)
    return do_dot, dlse_dot.reshape(b, h, lay.tq)
