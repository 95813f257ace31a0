"""The VJP's derivative along its primal inputs: how (g_q, g_k, g_v) move when (q, k, v, o, lse)
move along (q_dot, k_dot, v_dot, o_dot, lse_dot), the cotangent (g_o, g_lse) held fixed.

With the VJP's c = delta - g_lse (delta_i = g_o_i.o_i), dP = g_o v^T and dS = P (dP - c), and
along the direction S' = scale (q_dot k^T + q k_dot^T), P' = P (S' - lse_dot),
c' = g_o.o_dot, dP' = g_o v_dot^T:
    dS' = P' (dP - c) + P (dP' - c'),
    g_q' = scale (dS' k + dS k_dot),  g_k' = scale (dS'^T q + dS^T q_dot),  g_v' = P'^T g_o.
Two kernels, as the VJP's: g_q' query-major, g_k' and g_v' key-major (transposed tiles).
"""

from typing import Unpack

import jax
import jax.numpy as jnp

from ..types import Ref
from . import layout as lo
from . import tiles
from .tiles import Tiles, accumulate

_OPERANDS = "q k v k_dot v_dot q_dot g_o lse lse_dot c c_dot km"
_KINDS = "qd kd kv kd kv qd qv qs qs qs qs km"


def _dq_kernel(*refs: Ref, lay: lo.Layout, t: Tiles) -> None:
    r = lo.named(refs, _OPERANDS + " gq_dot lse_col lse_dot_col c_col c_dot_col acc")
    statistics = "lse lse_dot c c_dot"

    def step(i: jax.Array, j: jax.Array) -> None:
        q, k, k_dot = r.q[...], r.k[...], r.k_dot[...]
        lse, lse_dot, c, c_dot = lo.columns(r, statistics, lay.bk)
        p = t.probabilities(q, k, lay.valid(r.km[...], i, j), lse)
        ds, ds_prime, _ = tiles.vjp_jvp(
            t, p, q, k, r.v[...], r.q_dot[...], k_dot, r.v_dot[...], r.g_o[...], lse_dot, c, c_dot
        )
        r.acc[...] += accumulate(ds_prime, k) + accumulate(ds, k_dot)

    def finish() -> None:
        r.gq_dot[...] = (t.scale * r.acc[...]).astype(r.gq_dot.dtype)

    lo.query_major(lay, r, statistics, (r.acc,), step, finish)


def _dkv_kernel(*refs: Ref, lay: lo.Layout, t: Tiles) -> None:
    r = lo.named(refs, _OPERANDS + " gk_dot gv_dot key_col acc_k acc_v")

    def step(i: jax.Array, j: jax.Array) -> None:  # (bk, bq) tiles; statistics as (1, bq) rows
        q, k, q_dot, g_o = r.q[...], r.k[...], r.q_dot[...], r.g_o[...]
        p = t.probabilities(q, k, lay.valid_t(r.key_col[...], j, i), r.lse[...])
        stats = (r.lse_dot[...], r.c[...], r.c_dot[...])
        ds, ds_prime, p_prime = tiles.vjp_jvp(
            t, p, q, k, r.v[...], q_dot, r.k_dot[...], r.v_dot[...], g_o, *stats
        )
        r.acc_k[...] += accumulate(ds_prime, q) + accumulate(ds, q_dot)
        r.acc_v[...] += accumulate(p_prime, g_o)

    lo.key_major(lay, r, t, (r.gk_dot, r.gv_dot), step)


@lo.entry
def flash_vjp_jvp(*arrays: jax.Array, **static: Unpack[lo.Static]) -> tuple[jax.Array, ...]:
    """The derivative of ``flash_vjp``'s (g_q, g_k, g_v) along its primal inputs.

    Arrays: ``flash_vjp``'s (q, k, v, o, lse, key_mask, g_o, g_lse), then q_dot, k_dot, v_dot,
    o_dot (shaped like q, k, v, o) and lse_dot (B, H, Tq) float32: the direction of
    (q, k, v, o, lse). Keywords: ``layout.Static``.

    Returns:
      g_q_dot, g_k_dot, g_v_dot in the dtypes of q, k, v.
    """
    q, k, v, o, lse, key_mask, g_o, g_lse, q_dot, k_dot, v_dot, o_dot, lse_dot = arrays
    lay = lo.layout_of(arrays, static)
    c = tiles.row_dots(g_o, o) - g_lse.astype(jnp.float32)
    c_dot = tiles.row_dots(g_o, o_dot)
    stats = tuple(lo.stat_rows(x) for x in (lse, lse_dot, c, c_dot))
    operands = (q, k, v, k_dot, v_dot, q_dot, g_o, *stats, lo.key_rows(key_mask))
    dq_call = lo.Call(_KINDS, "qd", lo.row_scratch(lay, 4, lay.d), 5 * lay.d + 2 * lay.dv)
    out_q = (lo.out(q.shape, q.dtype, q),)
    (g_q_dot,) = lo.tiled_call(_dq_kernel, lay, dq_call, operands, out_q, static)
    depth = 5 * lay.d + 3 * lay.dv
    g_k_dot, g_v_dot = lo.key_major_call(_dkv_kernel, lay, _KINDS, depth, operands, static)
    return g_q_dot, g_k_dot, g_v_dot
