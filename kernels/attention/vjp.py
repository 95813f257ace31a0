"""The VJP kernels: g_q over query blocks, g_k and g_v over key blocks (the tangent's transpose)."""

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

_OPERANDS = "q k v lse c km g_o"
_KINDS = "qd kd kv qs qs km qv"


def _dq_kernel(*refs: Ref, lay: lo.Layout, scale: float) -> None:
    r = lo.named(refs, _OPERANDS + " g_q lse_col c_col acc")
    i, j = pl.program_id(2), pl.program_id(3)
    t = Tiles(scale)

    @pl.when(j == 0)
    def _init() -> None:
        r.lse_col[...] = lo.row_to_col(r.lse[...])
        r.c_col[...] = lo.row_to_col(r.c[...])
        r.acc[...] = jnp.zeros(r.acc.shape, jnp.float32)

    def _step() -> None:
        k = r.k[...]
        lse, c = lo.lanes(r.lse_col[...], lay.bk), lo.lanes(r.c_col[...], lay.bk)
        p = t.probabilities(r.q[...], k, lay.valid(r.km[...], i, j), lse)
        r.acc[...] += accumulate(t.ds(p, r.g_o[...], r.v[...], c), k)

    lo.when(lay.visits(i, j), _step)

    @pl.when(j == lay.nk - 1)
    def _finish() -> None:
        r.g_q[...] = (scale * r.acc[...]).astype(r.g_q.dtype)


def _dkv_kernel(*refs: Ref, lay: lo.Layout, scale: float) -> None:
    r = lo.named(refs, _OPERANDS + " g_k g_v key_col acc_k acc_v")
    j, i = pl.program_id(2), pl.program_id(3)
    t = Tiles(scale, key_major=True)

    @pl.when(i == 0)
    def _init() -> None:
        r.key_col[...] = lo.row_to_col((r.km[...] != 0).astype(jnp.float32))
        r.acc_k[...] = jnp.zeros(r.acc_k.shape, jnp.float32)
        r.acc_v[...] = jnp.zeros(r.acc_v.shape, jnp.float32)

    def _step() -> None:  # (bk, bq) tiles; the row statistics broadcast from (1, bq) rows
        q, g_o = r.q[...], r.g_o[...]
        p = t.probabilities(q, r.k[...], lay.valid_t(r.key_col[...], j, i), r.lse[...])
        r.acc_v[...] += accumulate(p, g_o)
        r.acc_k[...] += accumulate(t.ds(p, g_o, r.v[...], r.c[...]), q)

    lo.when(lay.visits(i, j), _step)

    @pl.when(i == lay.nq - 1)
    def _finish() -> None:
        r.g_k[...] = (scale * r.acc_k[...]).astype(r.g_k.dtype)
        r.g_v[...] = r.acc_v[...].astype(r.g_v.dtype)


@functools.partial(jax.jit, static_argnames=lo.STATIC)
def flash_vjp(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    o: jax.Array,
    lse: jax.Array,
    key_mask: jax.Array,
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
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The VJP of ``flash_forward`` (the transpose of ``flash_tangent``) for cotangents g_o, g_lse.

    Two kernels: g_q over query blocks (key blocks last), g_k and g_v over key blocks (query
    blocks last). c = g_o.o - g_lse is computed here in float32 from the saved o and passed as a
    row statistic.

    Returns:
      g_q, g_k, g_v in the dtypes of q, k, v. Arguments as ``flash_tangent``; g_o (B, H, Tq, Dv),
      g_lse (B, H, Tq).
    """
    lay = lo.layout(q, k, v, block_q, block_k, causal, q_offset)
    c = tiles.row_dots(g_o, o) - g_lse.astype(jnp.float32)
    operands = (q, k, v, lo.stat_rows(lse), lo.stat_rows(c), lo.key_rows(key_mask), g_o)
    params = lo.compiler_params(vmem_limit_bytes)
    rows = pltpu.VMEM((lay.bq, LANES), jnp.float32)
    dq_call = lo.Call(
        _KINDS, "qd", [rows, rows, pltpu.VMEM((lay.bq, lay.d), jnp.float32)], 2 * lay.d + lay.dv
    )
    kernel = functools.partial(_dq_kernel, lay=lay, scale=scale)
    out_q = (lo.out(q.shape, q.dtype, q),)
    (g_q,) = lo.tiled_call(kernel, lay, dq_call, operands, out_q, params, interpret)
    dkv_call = lo.Call(
        _KINDS,
        "kd kv",
        [pltpu.VMEM((lay.bk, w), jnp.float32) for w in (LANES, lay.d, lay.dv)],
        2 * lay.d + 2 * lay.dv,
        key_major=True,
    )
    kernel = functools.partial(_dkv_kernel, lay=lay, scale=scale)
    out_kv = (lo.out(k.shape, k.dtype, q), lo.out(v.shape, v.dtype, q))
    g_k, g_v = lo.tiled_call(kernel, lay, dkv_call, operands, out_kv, params, interpret)
    return g_q, g_k, g_v
