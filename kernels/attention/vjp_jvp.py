"""The VJP's derivative along its primal inputs: how (g_q, g_k, g_v) move when (q, k, v, o, lse)
move along (q_dot, k_dot, v_dot, o_dot, lse_dot), the cotangent (g_o, g_lse) held fixed.

With the VJP's c = delta - g_lse (delta_i = g_o_i.o_i), dP = g_o v^T and dS = P (dP - c), and
along the direction S' = scale (q_dot k^T + q k_dot^T), P' = P (S' - lse_dot),
c' = g_o.o_dot, dP' = g_o v_dot^T:
    dS' = P' (dP - c) + P (dP' - c'),
    g_q' = scale (dS' k + dS k_dot),  g_k' = scale (dS'^T q + dS^T q_dot),  g_v' = P'^T g_o.
Two kernels, as the VJP's: g_q' query-major, g_k' and g_v' key-major (transposed tiles).
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

_OPERANDS = "q k v k_dot v_dot q_dot g_o lse lse_dot c c_dot km"
_DQ_REFS = _OPERANDS + " gq_dot lse_col lse_dot_col c_col c_dot_col acc"
_DKV_REFS = _OPERANDS + " gk_dot gv_dot key_col acc_k acc_v"


def _dq_kernel(*refs: Ref, lay: lo.Layout, scale: float) -> None:
    r = lo.named(refs, _DQ_REFS)
    i, j = pl.program_id(2), pl.program_id(3)
    t = Tiles(scale)
    cols = (r.lse_col, r.lse_dot_col, r.c_col, r.c_dot_col)

    @pl.when(j == 0)
    def _init() -> None:
        for col, row in zip(cols, (r.lse, r.lse_dot, r.c, r.c_dot), strict=True):
            col[...] = lo.row_to_col(row[...])
        r.acc[...] = jnp.zeros(r.acc.shape, jnp.float32)

    def _step() -> None:
        q, k, k_dot = r.q[...], r.k[...], r.k_dot[...]
        lse, lse_dot, c, c_dot = (lo.lanes(col[...], lay.bk) for col in cols)
        p = t.probabilities(q, k, lay.valid(r.km[...], i, j), lse)
        ds, ds_prime, _ = tiles.vjp_jvp(
            t, p, q, k, r.v[...], r.q_dot[...], k_dot, r.v_dot[...], r.g_o[...], lse_dot, c, c_dot
        )
        r.acc[...] += accumulate(ds_prime, k) + accumulate(ds, k_dot)

    lo.when(lay.visits(i, j), _step)

    @pl.when(j == lay.nk - 1)
    def _finish() -> None:
        r.gq_dot[...] = (scale * r.acc[...]).astype(r.gq_dot.dtype)


def _dkv_kernel(*refs: Ref, lay: lo.Layout, scale: float) -> None:
    r = lo.named(refs, _DKV_REFS)
    j, i = pl.program_id(2), pl.program_id(3)
    t = Tiles(scale, key_major=True)

    @pl.when(i == 0)
    def _init() -> None:
        r.key_col[...] = lo.row_to_col((r.km[...] != 0).astype(jnp.float32))
        r.acc_k[...] = jnp.zeros(r.acc_k.shape, jnp.float32)
        r.acc_v[...] = jnp.zeros(r.acc_v.shape, jnp.float32)

    def _step() -> None:  # (bk, bq) tiles; the row statistics broadcast from (1, bq) rows
        q, k, q_dot, g_o = r.q[...], r.k[...], r.q_dot[...], r.g_o[...]
        p = t.probabilities(q, k, lay.valid_t(r.key_col[...], j, i), r.lse[...])
        stats = (r.lse_dot[...], r.c[...], r.c_dot[...])
        ds, ds_prime, p_prime = tiles.vjp_jvp(
            t, p, q, k, r.v[...], q_dot, r.k_dot[...], r.v_dot[...], g_o, *stats
        )
        r.acc_k[...] += accumulate(ds_prime, q) + accumulate(ds, q_dot)
        r.acc_v[...] += accumulate(p_prime, g_o)

    lo.when(lay.visits(i, j), _step)

    @pl.when(i == lay.nq - 1)
    def _finish() -> None:
        r.gk_dot[...] = (scale * r.acc_k[...]).astype(r.gk_dot.dtype)
        r.gv_dot[...] = r.acc_v[...].astype(r.gv_dot.dtype)


@functools.partial(jax.jit, static_argnames=lo.STATIC)
def flash_vjp_jvp(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    o: jax.Array,
    lse: jax.Array,
    key_mask: jax.Array,
    g_o: jax.Array,
    g_lse: jax.Array,
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
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The derivative of ``flash_vjp``'s (g_q, g_k, g_v) along its primal inputs.

    Arguments as ``flash_vjp``, then q_dot, k_dot, v_dot, o_dot (shaped like q, k, v, o) and
    lse_dot (B, H, Tq) float32: the direction of (q, k, v, o, lse).

    Returns:
      g_q_dot, g_k_dot, g_v_dot in the dtypes of q, k, v.
    """
    lay = lo.layout(q, k, v, block_q, block_k, causal, q_offset)
    c = tiles.row_dots(g_o, o) - g_lse.astype(jnp.float32)
    c_dot = tiles.row_dots(g_o, o_dot)
    stats = tuple(lo.stat_rows(x) for x in (lse, lse_dot, c, c_dot))
    operands = (q, k, v, k_dot, v_dot, q_dot, g_o, *stats, lo.key_rows(key_mask))
    kinds = "qd kd kv kd kv qd qv qs qs qs qs km"
    params = lo.compiler_params(vmem_limit_bytes)
    rows = pltpu.VMEM((lay.bq, LANES), jnp.float32)
    dq_call = lo.Call(
        kinds,
        "qd",
        [*(rows,) * 4, pltpu.VMEM((lay.bq, lay.d), jnp.float32)],
        5 * lay.d + 2 * lay.dv,
    )
    kernel = functools.partial(_dq_kernel, lay=lay, scale=scale)
    out_q = lo.out(q.shape, q.dtype, q)
    (g_q_dot,) = lo.tiled_call(kernel, lay, dq_call, operands, (out_q,), params, interpret)
    dkv_call = lo.Call(
        kinds,
        "kd kv",
        [pltpu.VMEM((lay.bk, w), jnp.float32) for w in (LANES, lay.d, lay.dv)],
        5 * lay.d + 3 * lay.dv,
        key_major=True,
    )
    kernel = functools.partial(_dkv_kernel, lay=lay, scale=scale)
    out_kv = (lo.out(k.shape, k.dtype, q), lo.out(v.shape, v.dtype, q))
    g_k_dot, g_v_dot = lo.tiled_call(kernel, lay, dkv_call, operands, out_kv, params, interpret)
    return g_q_dot, g_k_dot, g_v_dot
