"""The second-order VJP: the gradient in (q, k, v, o, lse) of <(g_o, g_lse), tangent(dq, dk, dv)>,
which is also that of <vjp(g_o, g_lse), (dq, dk, dv)> (the two passes are each other's transpose).

It is the reverse mode of the tangent in its primal inputs (the VJP of a JVP: a penalty's
second-order backward) and of the VJP in its primal inputs (the VJP of a VJP: nested
``jax.grad``). With the tangent's Sdot = scale (dq k^T + q dk^T), the VJP's c = delta - g_lse
(delta_i = g_o_i.o_i), dP = g_o v^T, dS = P (dP - c) and W = g_o dv^T:
    A = dS Sdot + P W,
    grad q = scale (A k + dS dk),   grad k = scale (A^T q + dS^T dq),   grad v = (P Sdot)^T g_o,
    grad o = -mu g_o with mu = sum_j P Sdot,   grad lse = -sum_j A.
Two kernels, as the VJP's: q, o and lse query-major, k and v key-major (transposed tiles).
"""

from typing import Unpack

import jax
import jax.numpy as jnp

from ..types import Ref
from . import layout as lo
from . import tiles
from .tiles import Tiles, accumulate

_OPERANDS = "q k v dk dv dq g_o lse c km"
_KINDS = "qd kd kv kd kv qd qv qs qs km"


def _q_kernel(*refs: Ref, lay: lo.Layout, t: Tiles) -> None:
    r = lo.named(refs, _OPERANDS + " grad_q grad_o grad_lse lse_col c_col mu sum_a acc")

    def step(i: jax.Array, j: jax.Array) -> None:
        q, k, dk = r.q[...], r.k[...], r.dk[...]
        lse, c = lo.columns(r, "lse c", lay.bk)
        p = t.probabilities(q, k, lay.valid(r.km[...], i, j), lse)
        ds, a, ps = tiles.second_vjp(t, p, q, k, r.v[...], r.dq[...], dk, r.dv[...], r.g_o[...], c)
        r.mu[...] += lo.row_sums(ps)
        r.sum_a[...] += lo.row_sums(a)
        r.acc[...] += accumulate(a, k) + accumulate(ds, dk)

    def finish() -> None:
        r.grad_q[...] = (t.scale * r.acc[...]).astype(r.grad_q.dtype)
        mu = lo.lanes(r.mu[...], lay.dv)
        r.grad_o[...] = (-mu * r.g_o[...].astype(jnp.float32)).astype(r.grad_o.dtype)
        r.grad_lse[...] = lo.col_to_row(-r.sum_a[...])

    lo.query_major(lay, r, "lse c", (r.mu, r.sum_a, r.acc), step, finish)


def _kv_kernel(*refs: Ref, lay: lo.Layout, t: Tiles) -> None:
    r = lo.named(refs, _OPERANDS + " grad_k grad_v key_col acc_k acc_v")

    def step(i: jax.Array, j: jax.Array) -> None:  # (bk, bq) tiles; statistics as (1, bq) rows
        q, k, dq, g_o = r.q[...], r.k[...], r.dq[...], r.g_o[...]
        p = t.probabilities(q, k, lay.valid_t(r.key_col[...], j, i), r.lse[...])
        ds, a, ps = tiles.second_vjp(t, p, q, k, r.v[...], dq, r.dk[...], r.dv[...], g_o, r.c[...])
        r.acc_k[...] += accumulate(a, q) + accumulate(ds, dq)
        r.acc_v[...] += accumulate(ps, g_o)

    lo.key_major(lay, r, t, (r.grad_k, r.grad_v), step)


@lo.entry
def flash_second_vjp(*arrays: jax.Array, **static: Unpack[lo.Static]) -> tuple[jax.Array, ...]:
    """The gradient in (q, k, v, o, lse) of <(g_o, g_lse), flash_tangent(..., dq, dk, dv)>.

    Arrays: ``flash_tangent``'s (q, k, v, o, lse, key_mask, dq, dk, dv), then g_o (B, H, Tq, Dv)
    and g_lse (B, H, Tq) as ``flash_vjp``'s. Keywords: ``layout.Static``.

    Returns:
      The gradients of q, k, v, o in their dtypes and of lse (B, H, Tq) float32.
    """
    q, k, v, o, lse, key_mask, dq, dk, dv, g_o, g_lse = arrays
    lay = lo.layout_of(arrays, static)
    c = tiles.row_dots(g_o, o) - g_lse.astype(jnp.float32)
    rows = (lo.stat_rows(lse), lo.stat_rows(c), lo.key_rows(key_mask))
    operands = (q, k, v, dk, dv, dq, g_o, *rows)
    q_call = lo.Call(_KINDS, "qd qv qs", lo.row_scratch(lay, 4, lay.d), 5 * lay.d + 2 * lay.dv)
    lse_rows = lo.o_and_lse(lay, q)[1]
    out_q = (lo.out(q.shape, q.dtype, q), lo.out(o.shape, o.dtype, q), lse_rows)
    grad_q, grad_o, grad_lse = lo.tiled_call(_q_kernel, lay, q_call, operands, out_q, static)
    depth = 5 * lay.d + 3 * lay.dv
    grad_k, grad_v = lo.key_major_call(_kv_kernel, lay, _KINDS, depth, operands, static)
    return grad_q, grad_k, grad_v, grad_o, grad_lse.reshape(lay.batch, lay.heads, lay.tq)
