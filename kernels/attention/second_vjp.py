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

``flash_second_vjp_and_vjp`` also returns the gradient in (dq, dk, dv), which is the VJP of
(g_o, g_lse): the whole reverse mode of the tangent, as a penalty's backward takes it. The tiles
hold dS and P already, so it adds only the VJP's last products (scale dS k, scale dS^T q,
P^T g_o) and saves a VJP call.
"""

import functools
from typing import Any, Unpack

import jax
import jax.numpy as jnp

from ..types import Ref
from . import layout as lo
from . import tiles
from .tiles import Tiles, accumulate

_OPERANDS = "q k v dk dv dq g_o lse c km"
_KINDS = "qd kd kv kd kv qd qv qs qs km"


def _q_kernel(*refs: Ref, lay: lo.Layout, t: Tiles, with_vjp: bool = False) -> None:
    outputs = " grad_q grad_o grad_lse" + " g_q" * with_vjp
    scratch = " lse_col c_col mu sum_a acc" + " acc_g" * with_vjp
    r = lo.named(refs, _OPERANDS + outputs + scratch)

    def step(i: jax.Array, j: jax.Array) -> None:
        q, k, dk = r.q[...], r.k[...], r.dk[...]
        lse, c = lo.columns(r, "lse c", lay.bk)
        p = t.probabilities(q, k, lay.valid(r.km[...], i, j), lse)
        ds, a, ps = tiles.second_vjp(t, p, q, k, r.v[...], r.dq[...], dk, r.dv[...], r.g_o[...], c)
        r.mu[...] += lo.row_sums(ps)
        r.sum_a[...] += lo.row_sums(a)
        r.acc[...] += accumulate(a, k) + accumulate(ds, dk)
        if with_vjp:
            r.acc_g[...] += accumulate(ds, k)

    def finish() -> None:
        r.grad_q[...] = (t.scale * r.acc[...]).astype(r.grad_q.dtype)
        mu = lo.lanes(r.mu[...], lay.dv)
        r.grad_o[...] = (-mu * r.g_o[...].astype(jnp.float32)).astype(r.grad_o.dtype)
        r.grad_lse[...] = lo.col_to_row(-r.sum_a[...])
        if with_vjp:
            r.g_q[...] = (t.scale * r.acc_g[...]).astype(r.g_q.dtype)

    accumulators = (r.mu, r.sum_a, r.acc) + ((r.acc_g,) if with_vjp else ())
    lo.query_major(lay, r, "lse c", accumulators, step, finish)


def _kv_kernel(*refs: Ref, lay: lo.Layout, t: Tiles, with_vjp: bool = False) -> None:
    outputs = " grad_k grad_v" + " g_k g_v" * with_vjp
    scratch = " key_col acc_k acc_v" + " acc_gk acc_gv" * with_vjp
    r = lo.named(refs, _OPERANDS + outputs + scratch)

    def step(i: jax.Array, j: jax.Array) -> None:  # (bk, bq) tiles; statistics as (1, bq) rows
        q, k, dq, g_o = r.q[...], r.k[...], r.dq[...], r.g_o[...]
        p = t.probabilities(q, k, lay.valid_t(r.key_col[...], j, i), r.lse[...])
        ds, a, ps = tiles.second_vjp(t, p, q, k, r.v[...], dq, r.dk[...], r.dv[...], g_o, r.c[...])
        r.acc_k[...] += accumulate(a, q) + accumulate(ds, dq)
        r.acc_v[...] += accumulate(ps, g_o)
        if with_vjp:
            r.acc_gk[...] += accumulate(ds, q)
            r.acc_gv[...] += accumulate(p, g_o)

    outs, accumulators = [r.grad_k, r.grad_v], [r.acc_k, r.acc_v]
    if with_vjp:
        outs, accumulators = [*outs, r.g_k, r.g_v], [*accumulators, r.acc_gk, r.acc_gv]
    lo.key_major(lay, r, t, outs, accumulators, step)


def _second_vjp(
    arrays: tuple[jax.Array, ...], static: lo.Static, with_vjp: bool
) -> tuple[jax.Array, ...]:
    q, k, v, o, lse, key_mask, dq, dk, dv, g_o, g_lse = arrays
    lay = lo.layout_of(arrays, static)
    c = tiles.row_dots(g_o, o) - g_lse.astype(jnp.float32)
    rows = (lo.stat_rows(lse), lo.stat_rows(c), lo.key_rows(key_mask))
    operands = (q, k, v, dk, dv, dq, g_o, *rows)
    q_scratch = lo.row_scratch(lay, 4, lay.d)
    q_depth, kv_depth = 5 * lay.d + 2 * lay.dv, 5 * lay.d + 3 * lay.dv
    _, lse_rows = lo.o_and_lse(lay, q)
    out_q: tuple[Any, ...] = (lo.out(q.shape, q.dtype, q), lo.out(o.shape, o.dtype, q), lse_rows)
    if with_vjp:  # and the VJP's scale dS k, scale dS^T q and P^T g_o
        q_scratch += lo.row_scratch(lay, 0, lay.d)
        q_depth, kv_depth = q_depth + lay.d, kv_depth + lay.d + lay.dv
        out_q += (lo.out(q.shape, q.dtype, q),)
    q_call = lo.Call(_KINDS, "qd qv qs" + " qd" * with_vjp, q_scratch, q_depth)
    q_kernel = functools.partial(_q_kernel, with_vjp=with_vjp)
    grad_q, grad_o, grad_lse, *g_q = lo.tiled_call(q_kernel, lay, q_call, operands, out_q, static)
    kv_kernel = functools.partial(_kv_kernel, with_vjp=with_vjp)
    grad_k, grad_v, *g_kv = lo.key_major_call(
        kv_kernel, lay, _KINDS, kv_depth, operands, static, pairs=1 + with_vjp
    )
    grad_lse = grad_lse.reshape(lay.batch, lay.heads, lay.tq)
    return grad_q, grad_k, grad_v, grad_o, grad_lse, *g_q, *g_kv


@lo.entry
def flash_second_vjp(*arrays: jax.Array, **static: Unpack[lo.Static]) -> tuple[jax.Array, ...]:
    """The gradient in (q, k, v, o, lse) of <(g_o, g_lse), flash_tangent(..., dq, dk, dv)>.

    Arrays: ``flash_tangent``'s (q, k, v, o, lse, key_mask, dq, dk, dv), then g_o (B, H, Tq, Dv)
    and g_lse (B, H, Tq) as ``flash_vjp``'s. Keywords: ``layout.Static``.

    Returns:
      The gradients of q, k, v, o in their dtypes and of lse (B, H, Tq) float32.
    """
    return _second_vjp(arrays, static, with_vjp=False)


@lo.entry
def flash_second_vjp_and_vjp(
    *arrays: jax.Array, **static: Unpack[lo.Static]
) -> tuple[jax.Array, ...]:
    """``flash_second_vjp``'s five gradients, then ``flash_vjp``'s g_q, g_k, g_v of the same
    (g_o, g_lse): the gradient of <(g_o, g_lse), flash_tangent(...)> in (q, k, v, o, lse) and in
    (dq, dk, dv). Arrays and keywords: ``flash_second_vjp``'s."""
    return _second_vjp(arrays, static, with_vjp=True)
