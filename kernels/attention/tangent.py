"""The JVP kernel: the tangent of the output and of the log-sum-exp along (dq, dk, dv)."""

from typing import Unpack

import jax
import jax.numpy as jnp

from ..types import Ref
from . import layout as lo
from .tiles import Tiles, accumulate


def _kernel(*refs: Ref, lay: lo.Layout, t: Tiles) -> None:
    r = lo.named(refs, "q k v o lse km dq dk dv do dlse lse_col mu acc")

    def step(i: jax.Array, j: jax.Array) -> None:
        q, k = r.q[...], r.k[...]
        (lse,) = lo.columns(r, "lse", lay.bk)
        p = t.probabilities(q, k, lay.valid(r.km[...], i, j), lse)
        ps = p * t.along(q, k, r.dq[...], r.dk[...])
        r.mu[...] += lo.row_sums(ps)
        r.acc[...] += accumulate(ps, r.v[...]) + accumulate(p, r.dv[...])

    def finish() -> None:
        mu = r.mu[...]
        o = r.o[...].astype(jnp.float32)
        r.do[...] = (r.acc[...] - lo.lanes(mu, lay.dv) * o).astype(r.do.dtype)
        r.dlse[...] = lo.col_to_row(mu)

    lo.query_major(lay, r, "lse", (r.mu, r.acc), step, finish)


@lo.entry
def flash_tangent(*arrays: jax.Array, **static: Unpack[lo.Static]) -> tuple[jax.Array, jax.Array]:
    """The JVP of ``flash_forward`` at (q, k, v) with its saved o, lse, along (dq, dk, dv).

    Arrays: q, k, v, o, lse, key_mask, dq, dk, dv (``flash_forward``'s arrays and outputs, and
    tangents shaped like q, k, v). Keywords: ``layout.Static``.

    Returns:
      do (B, H, Tq, Dv) in q.dtype and dlse (B, H, Tq) float32.
    """
    q, k, v, o, lse, key_mask, dq, dk, dv = arrays
    lay = lo.layout_of(arrays, static)
    b, h = lay.batch, lay.heads
    scratch = lo.row_scratch(lay, 2, lay.dv)
    call = lo.Call("qd kd kv qv qs km qd kd kv", "qv qs", scratch, 3 * lay.d + 2 * lay.dv)
    operands = (q, k, v, o, lo.stat_rows(lse), lo.key_rows(key_mask), dq, dk, dv)
    do, dlse = lo.tiled_call(_kernel, lay, call, operands, lo.o_and_lse(lay, q), static)
    return do, dlse.reshape(b, h, lay.tq)
