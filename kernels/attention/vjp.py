"""The VJP kernels: g_q over query blocks, g_k and g_v over key blocks (the tangent's transpose)."""

from typing import Unpack

import jax
import jax.numpy as jnp

from ..types import Ref
from . import layout as lo
from . import tiles
from .tiles import Tiles, accumulate

_OPERANDS = "q k v lse c km g_o"
_KINDS = "qd kd kv qs qs km qv"


def _dq_kernel(*refs: Ref, lay: lo.Layout, t: Tiles) -> None:
    r = lo.named(refs, _OPERANDS + " g_q lse_col c_col acc")

    def step(i: jax.Array, j: jax.Array) -> None:
        k = r.k[...]
        lse, c = lo.columns(r, "lse c", lay.bk)
        p = t.probabilities(r.q[...], k, lay.valid(r.km[...], i, j), lse)
        r.acc[...] += accumulate(t.ds(p, r.g_o[...], r.v[...], c), k)

    def finish() -> None:
        r.g_q[...] = (t.scale * r.acc[...]).astype(r.g_q.dtype)

    lo.query_major(lay, r, "lse c", (r.acc,), step, finish)


def _dkv_kernel(*refs: Ref, lay: lo.Layout, t: Tiles) -> None:
    r = lo.named(refs, _OPERANDS + " g_k g_v key_col acc_k acc_v")

    def step(i: jax.Array, j: jax.Array) -> None:  # (bk, bq) tiles; statistics as (1, bq) rows
        q, g_o = r.q[...], r.g_o[...]
        p = t.probabilities(q, r.k[...], lay.valid_t(r.key_col[...], j, i), r.lse[...])
        r.acc_v[...] += accumulate(p, g_o)
        r.acc_k[...] += accumulate(t.ds(p, g_o, r.v[...], r.c[...]), q)

    lo.key_major(lay, r, t, (r.g_k, r.g_v), step)


@lo.entry
def flash_vjp(*arrays: jax.Array, **static: Unpack[lo.Static]) -> tuple[jax.Array, ...]:
    """The VJP of ``flash_forward`` (the transpose of ``flash_tangent``) for cotangents g_o, g_lse.

    Arrays: q, k, v, o, lse, key_mask, g_o (B, H, Tq, Dv), g_lse (B, H, Tq). Keywords:
    ``layout.Static``. Two kernels: g_q over query blocks (key blocks last), g_k and g_v over key
    blocks (query blocks last); c = g_o.o - g_lse, from the saved o, is a float32 row statistic.

    Returns:
      g_q, g_k, g_v in the dtypes of q, k, v.
    """
    q, k, v, o, lse, key_mask, g_o, g_lse = arrays
    lay = lo.layout_of(arrays, static)
    c = tiles.row_dots(g_o, o) - g_lse.astype(jnp.float32)
    operands = (q, k, v, lo.stat_rows(lse), lo.stat_rows(c), lo.key_rows(key_mask), g_o)
    dq_call = lo.Call(_KINDS, "qd", lo.row_scratch(lay, 2, lay.d), 2 * lay.d + lay.dv)
    out_q = (lo.out(q.shape, q.dtype, q),)
    (g_q,) = lo.tiled_call(_dq_kernel, lay, dq_call, operands, out_q, static)
    depth = 2 * lay.d + 2 * lay.dv
    g_k, g_v = lo.key_major_call(_dkv_kernel, lay, _KINDS, depth, operands, static)
    return g_q, g_k, g_v
