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

_OPERANDS = "q k v dk dv dq g_o lse c km"
_KINDS = "qd kd kv kd kv qd qv qs qs km"
_Q_REFS = _OPERANDS + " grad_q grad_o grad_lse lse_col c_col mu sum_a acc"
_KV_REFS = _OPERANDS + " grad_k grad_v key_col acc_k acc_v"


def _q_kernel(*refs: Ref, lay: lo.Layout, scale: float) -> None:
    r = lo.named(refs, _Q_REFS)
    i, j = pl.program_id(2), pl.program_id(3)
    t = Tiles(scale)

    @pl.when(j == 0)
    def _init() -> None:
        r.lse_col[...] = lo.row_to_col(r.lse[...])
        r.c_col[...] = lo.row_to_col(r.c[...])
        for acc in (r.mu, r.sum_a, r.acc):
            acc[...] = jnp.zeros(acc.shape, jnp.float32)

    def _step() -> None:
        q, k, dk = r.q[...], r.k[...], r.dk[...]
        lse, c = lo.lanes(r.lse_col[...], lay.bk), lo.lanes(r.c_col[...], lay.bk)
        p = t.probabilities(q, k, lay.valid(r.km[...], i, j), lse)
        ds, a, ps = tiles.second_vjp(t, p, q, k, r.v[...], r.dq[...], dk, r.dv[...], r.g_o[...], c)
        r.mu[...] += lo.row_sums(ps)
        r.sum_a[...] += lo.row_sums(a)
        r.acc[...] += accumulate(a, k) + accumulate(ds, dk)

    lo.when(lay.visits(i, j), _step)

    @pl.when(j == lay.nk - 1)
    def _finish() -> None:
        r.grad_q[...] = (scale * r.acc[...]).astype(r.grad_q.dtype)
        mu = lo.lanes(r.mu[...], lay.dv)
        r.grad_o[...] = (-mu * r.g_o[...].astype(jnp.float32)).astype(r.grad_o.dtype)
        r.grad_lse[...] = lo.col_to_row(-r.sum_a[...])


def _kv_kernel(*refs: Ref, lay: lo.Layout, scale: float) -> None:
    r = lo.named(refs, _KV_REFS)
    j, i = pl.program_id(2), pl.program_id(3)
    t = Tiles(scale, key_major=True)

    @pl.when(i == 0)
    def _init() -> None:
        r.key_col[...] = lo.row_to_col((r.km[...] != 0).astype(jnp.float32))
        r.acc_k[...] = jnp.zeros(r.acc_k.shape, jnp.float32)
        r.acc_v[...] = jnp.zeros(r.acc_v.shape, jnp.float32)

    def _step() -> None:  # (bk, bq) tiles; the row statistics broadcast from (1, bq) rows
        q, k, dq, g_o = r.q[...], r.k[...], r.dq[...], r.g_o[...]
        p = t.probabilities(q, k, lay.valid_t(r.key_col[...], j, i), r.lse[...])
        ds, a, ps = tiles.second_vjp(t, p, q, k, r.v[...], dq, r.dk[...], r.dv[...], g_o, r.c[...])
        r.acc_k[...] += accumulate(a, q) + accumulate(ds, dq)
        r.acc_v[...] += accumulate(ps, g_o)

    lo.when(lay.visits(i, j), _step)

    @pl.when(i == lay.nq - 1)
    def _finish() -> None:
        r.grad_k[...] = (scale * r.acc_k[...]).astype(r.grad_k.dtype)
        r.grad_v[...] = r.acc_v[...].astype(r.grad_v.dtype)


@functools.partial(jax.jit, static_argnames=lo.STATIC)
def flash_second_vjp(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    o: jax.Array,
    lse: jax.Array,
    key_mask: jax.Array,
    dq: jax.Array,
    dk: jax.Array,
    dv: jax.Array,
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
) -> tuple[jax.Array, ...]:
    """The gradient in (q, k, v, o, lse) of <(g_o, g_lse), flash_tangent(..., dq, dk, dv)>.

    Arguments as ``flash_tangent``, then g_o (B, H, Tq, Dv) and g_lse (B, H, Tq) as
    ``flash_vjp``'s.

    Returns:
      The gradients of q, k, v, o in their dtypes and of lse (B, H, Tq) float32.
    """
    lay = lo.layout(q, k, v, block_q, block_k, causal, q_offset)
    b, h = lay.batch, lay.heads
    c = tiles.row_dots(g_o, o) - g_lse.astype(jnp.float32)
    rows = (lo.stat_rows(lse), lo.stat_rows(c), lo.key_rows(key_mask))
    operands = (q, k, v, dk, dv, dq, g_o, *rows)
    params = lo.compiler_params(vmem_limit_bytes)
    row_scratch = pltpu.VMEM((lay.bq, LANES), jnp.float32)
    q_call = lo.Call(
        _KINDS,
        "qd qv qs",
        [*(row_scratch,) * 4, pltpu.VMEM((lay.bq, lay.d), jnp.float32)],
        5 * lay.d + 2 * lay.dv,
    )
    out_q = (
        lo.out(q.shape, q.dtype, q),
        lo.out(o.shape, o.dtype, q),
        lo.out((b, h, 1, lay.tq), jnp.float32, q),
    )
    kernel = functools.partial(_q_kernel, lay=lay, scale=scale)
    g_q, g_o_out, g_lse_out = lo.tiled_call(kernel, lay, q_call, operands, out_q, params, interpret)
    kv_call = lo.Call(
        _KINDS,
        "kd kv",
        [pltpu.VMEM((lay.bk, w), jnp.float32) for w in (LANES, lay.d, lay.dv)],
        5 * lay.d + 3 * lay.dv,
        key_major=True,
    )
    out_kv = (lo.out(k.shape, k.dtype, q), lo.out(v.shape, v.dtype, q))
    kernel = functools.partial(_kv_kernel, lay=lay, scale=scale)
    g_k, g_v = lo.tiled_call(kernel, lay, kv_call, operands, out_kv, params, interpret)
    return g_q, g_k, g_v, g_o_out, g_lse_out.reshape(b, h, lay.tq)
