"""The tangent's derivative along its primal inputs: how (do, dlse) move when (q, k, v, o, lse)
move along (q_dot, k_dot, v_dot, o_dot, lse_dot), the tangent (dq, dk, dv) held fixed.

One query-major kernel. With the tangent's Sdot = scale (dq k^T + q dk^T), S' = scale (q_dot k^T
+ q k_dot^T), Sdot' = scale (dq k_dot^T + q_dot dk^T) and P' = P (S' - lse_dot):
    M = P' Sdot + P Sdot',  mu = sum_j P Sdot,  mu' = sum_j M,
    do' = sum_j (M v + P' dv + P Sdot v_dot) - mu' o - mu o_dot,   dlse' = mu'.
"""

from typing import Unpack

import jax
import jax.numpy as jnp

from ..types import Ref
from . import layout as lo
from . import tiles
from .tiles import Tiles, accumulate

_REFS = (
    "q k v o lse km dq dk dv q_dot k_dot v_dot o_dot lse_dot"  # operands
    " do_dot dlse_dot"  # outputs
    " lse_col lse_dot_col mu mu_dot acc"  # scratch
)


def _kernel(*refs: Ref, lay: lo.Layout, t: Tiles) -> None:
    r = lo.named(refs, _REFS)

    def step(i: jax.Array, j: jax.Array) -> None:
        q, k = r.q[...], r.k[...]
        lse, lse_dot = lo.columns(r, "lse lse_dot", lay.bk)
        p = t.probabilities(q, k, lay.valid(r.km[...], i, j), lse)
        ps, m, p_prime = tiles.tangent_jvp(
            t, p, q, k, r.dq[...], r.dk[...], r.q_dot[...], r.k_dot[...], lse_dot
        )
        r.mu[...] += lo.row_sums(ps)
        r.mu_dot[...] += lo.row_sums(m)
        r.acc[...] += (
            accumulate(m, r.v[...]) + accumulate(p_prime, r.dv[...]) + accumulate(ps, r.v_dot[...])
        )

    def finish() -> None:
        mu, mu_dot = lo.lanes(r.mu[...], lay.dv), lo.lanes(r.mu_dot[...], lay.dv)
        o, o_dot = r.o[...].astype(jnp.float32), r.o_dot[...].astype(jnp.float32)
        r.do_dot[...] = (r.acc[...] - mu_dot * o - mu * o_dot).astype(r.do_dot.dtype)
        r.dlse_dot[...] = lo.col_to_row(r.mu_dot[...])

    lo.query_major(lay, r, "lse lse_dot", (r.mu, r.mu_dot, r.acc), step, finish)


@lo.entry
def flash_tangent_jvp(
    *arrays: jax.Array, **static: Unpack[lo.Static]
) -> tuple[jax.Array, jax.Array]:
    """The derivative of ``flash_tangent``'s (do, dlse) along its primal inputs.

    Arrays: ``flash_tangent``'s (q, k, v, o, lse, key_mask, dq, dk, dv), then q_dot, k_dot,
    v_dot, o_dot (shaped like q, k, v, o) and lse_dot (B, H, Tq) float32: the direction of
    (q, k, v, o, lse). Keywords: ``layout.Static``.

    Returns:
      do_dot (B, H, Tq, Dv) in q.dtype and dlse_dot (B, H, Tq) float32.
    """
    q, k, v, o, lse, key_mask, dq, dk, dv, q_dot, k_dot, v_dot, o_dot, lse_dot = arrays
    lay = lo.layout_of(arrays, static)
    call = lo.Call(
        kinds="qd kd kv qv qs km qd kd kv qd kd kv qv qs",
        out_kinds="qv qs",
        scratch=lo.row_scratch(lay, 4, lay.dv),
        depth=7 * lay.d + 3 * lay.dv,
    )
    operands = (
        *(q, k, v, o, lo.stat_rows(lse), lo.key_rows(key_mask), dq, dk, dv),
        *(q_dot, k_dot, v_dot, o_dot, lo.stat_rows(lse_dot)),
    )
    do_dot, dlse_dot = lo.tiled_call(_kernel, lay, call, operands, lo.o_and_lse(lay, q), static)
    return do_dot, dlse_dot.reshape(lay.batch, lay.heads, lay.tq)
