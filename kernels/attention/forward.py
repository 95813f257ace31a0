"""The forward kernel: online softmax over key blocks, with the log-sum-exp."""

from typing import Unpack

import jax
import jax.numpy as jnp

from ..types import Ref
from . import layout as lo
from .tiles import NEG, Tiles, accumulate, nt


def _kernel(*refs: Ref, lay: lo.Layout, t: Tiles) -> None:
    r = lo.named(refs, "q k v km o lse m l acc")

    def init() -> None:
        r.m[...] = jnp.full(r.m.shape, NEG, jnp.float32)
        lo.zero(r.l, r.acc)

    def step(i: jax.Array, j: jax.Array) -> None:
        s = t.scale * nt(r.q[...], r.k[...])
        valid = lay.valid(r.km[...], i, j)
        m_prev = r.m[...]
        m_next = jnp.maximum(m_prev, jnp.max(jnp.where(valid, s, NEG), axis=1, keepdims=True))
        p = jnp.exp(jnp.where(valid, s - lo.lanes(m_next, lay.bk), NEG))
        alpha = jnp.exp(m_prev - m_next)
        r.l[...] = alpha * r.l[...] + lo.row_sums(p)
        r.m[...] = m_next
        r.acc[...] = r.acc[...] * lo.lanes(alpha, lay.dv) + accumulate(p, r.v[...])

    def finish() -> None:
        total = r.l[...]
        some = total > 0.0
        safe = jnp.where(some, total, 1.0)
        inv = jnp.where(some, 1.0 / safe, 0.0)
        r.o[...] = (r.acc[...] * lo.lanes(inv, lay.dv)).astype(r.o.dtype)
        r.lse[...] = lo.col_to_row(jnp.where(some, r.m[...] + jnp.log(safe), 0.0))

    lo.grid_steps(lay, False, init, step, finish)


@lo.entry
def flash_forward(*arrays: jax.Array, **static: Unpack[lo.Static]) -> tuple[jax.Array, jax.Array]:
    """Attention forward with its log-sum-exp: online softmax over key blocks.

    Arrays: q, k, v of shapes (B, H, Tq, D), (B, H, Tk, D), (B, H, Tk, Dv) (f32, bf16 or f16)
    and key_mask (B, Tk) int32, 1 = valid key. Keywords: ``layout.Static``.

    Returns:
      o (B, H, Tq, Dv) in q.dtype and lse (B, H, Tq) float32 (0 and 0 for rows with no valid key).
    """
    q, k, v, key_mask = arrays
    lay = lo.layout_of(arrays, static)
    b, h = lay.batch, lay.heads
    scratch = lo.row_scratch(lay, 2, lay.dv)
    call = lo.Call("qd kd kv km", "qv qs", scratch, lay.d + lay.dv, rescales=True)
    operands = (q, k, v, lo.key_rows(key_mask))
    o, lse = lo.tiled_call(_kernel, lay, call, operands, lo.o_and_lse(lay, q), static)
    return o, lse.reshape(b, h, lay.tq)
