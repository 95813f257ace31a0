"""Attention's forward, JVP and VJP as blockwise jnp/lax loops over key blocks (the XLA backend).

Shapes (``bhtd`` layout, already padded so that ``Tk`` is a multiple of ``block_k``):

    q (B, H, Tq, D)   k (B, H, Tk, D)   v (B, H, Tk, Dv)   key_mask (B, Tk) bool
    o (B, H, Tq, Dv) in q's dtype       lse (B, H, Tq) float32

With valid_ij = key_mask_j and (j <= i if causal), S = scale·q kᵀ and, for a row with a valid key,
lse_i = log Σ_valid exp(S_ij), P_ij = valid_ij · exp(S_ij - lse_i); a row with none has lse 0,
P 0 and o 0. Only a (Tq, block_k) block of scores exists at a time. Each pass after the forward
reads P from the saved lse, so its loop carries sums only; the block's work is rematerialised
(``jax.checkpoint``), so that JAX's own derivatives of these loops save the loop's inputs, not
its score blocks. Everything accumulates in float32.
"""

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from fastgp._attention.config import Config

F32 = jnp.float32
Arrays = tuple[jax.Array, ...]
RowsResult = tuple[Arrays, Arrays]  # a row pass's (row outputs, column sums)


def _key_blocks(x: jax.Array, block_k: int) -> jax.Array:
    """(B, H, Tk, D) -> (Tk / block_k, B, H, block_k, D): the scan's per-step slices."""
    b, h, t, d = x.shape
    return jnp.moveaxis(x.reshape(b, h, t // block_k, block_k, d), 2, 0)


def _unblock(x: jax.Array) -> jax.Array:
    """Inverse of :func:`_key_blocks`."""
    n, b, h, bk, d = x.shape
    return jnp.moveaxis(x, 0, 2).reshape(b, h, n * bk, d)


def _mask_blocks(key_mask: jax.Array, block_k: int) -> jax.Array:
    b, t = key_mask.shape
    return jnp.moveaxis(key_mask.reshape(b, t // block_k, block_k), 1, 0)


def _zeros_like_outputs(
    q: jax.Array, k: jax.Array, v: jax.Array, key_mask: jax.Array, width: int
) -> tuple[jax.Array, jax.Array]:
    """Float32 zeros (B, H, Tq) and (B, H, Tq, width) typed like the loop's outputs: varying over
    the manual mesh axes of any input (shard_map) and sharded as q's leading axes (explicit
    axes), so that the scan's carry keeps one type."""
    rows = (
        jnp.zeros_like(q[..., 0], F32)
        + jnp.zeros_like(k[:, :, :1, 0], F32)
        + jnp.zeros_like(v[:, :, :1, 0], F32)
        + jnp.zeros_like(key_mask[:, None, :1], F32)
    )
    wide = rows[..., None] + jnp.zeros_like(v[:, :, :1, :1], F32)
    return rows, jnp.broadcast_to(wide, (*rows.shape, width))


@dataclasses.dataclass(frozen=True)
class _Rows:
    """The block of query rows a row pass works on (from ``q_start``) under ``config``."""

    config: Config
    q_start: Any = 0

    def scores(self, q: jax.Array, k_blk: jax.Array) -> jax.Array:
        """(B, H, Tq, block_k) float32 scale · q kᵀ."""
        return self.config.scale * jnp.einsum(
            "bhqd,bhkd->bhqk", q, k_blk, preferred_element_type=F32
        )

    def valid(self, mask_blk: jax.Array, start: jax.Array, tq: int) -> jax.Array:
        """(B, 1, Tq, block_k) bool: key padding and, if causal, j <= q_offset + i (keys from
        ``start``)."""
        valid = mask_blk[:, None, None, :]
        if self.config.causal:
            shape = (tq, mask_blk.shape[-1])
            rows = self.config.q_offset + self.q_start + lax.broadcasted_iota(jnp.int32, shape, 0)
            cols = start + lax.broadcasted_iota(jnp.int32, shape, 1)
            valid = valid & (cols <= rows)[None, None]
        return valid

    def probabilities(
        self, q: jax.Array, k_blk: jax.Array, lse: jax.Array, valid: jax.Array
    ) -> jax.Array:
        """(B, H, Tq, block_k) float32 P from the saved log-sum-exp."""
        s = self.scores(q, k_blk)
        return jnp.where(valid, jnp.exp(jnp.where(valid, s - lse[..., None], 0.0)), 0.0)

    def scan_keys(
        self,
        block_fn: Callable[..., tuple[Arrays, Any]],
        init: Arrays,
        keys: Arrays,
        key_mask: jax.Array,
    ) -> tuple[Arrays, Any]:
        """Sum ``block_fn(start, *key_blocks, mask_blk)[0]`` over blocks of ``block_k`` keys of
        ``keys``; its second result is per block.

        ``block_fn`` returns (sums, per_block); it is rematerialised so that derivatives of the loop
        keep its inputs only.
        """
        body_fn = jax.checkpoint(block_fn, prevent_cse=False, static_argnums=())
        blocked = (
            *(_key_blocks(x, self.config.block_k) for x in keys),
            _mask_blocks(key_mask, self.config.block_k),
        )

        def body(carry: Arrays, xs: Arrays):  # type: ignore[no-untyped-def]
            index, *blocks = xs
            sums, per_block = body_fn(index * self.config.block_k, *blocks)
            return tuple(c + s for c, s in zip(carry, sums, strict=True)), per_block

        count = blocked[0].shape[0]
        return lax.scan(body, init, (jnp.arange(count, dtype=jnp.int32), *blocked))


def _forward_rows(at: _Rows, rows: Arrays, keys: Arrays) -> RowsResult:
    """Rows (q,), keys (k, v, key_mask) -> ((o in q's dtype, lse float32), ()) by online softmax."""
    (q,), (k, v, key_mask) = rows, keys
    tq = q.shape[2]
    dv = v.shape[-1]

    def step(carry, xs):  # type: ignore[no-untyped-def]
        m, total, acc = carry
        index, k_blk, v_blk, mask_blk = xs
        valid = at.valid(mask_blk, index * at.config.block_k, tq)
        s = jnp.where(valid, at.scores(q, k_blk), -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
        p = jnp.where(valid, jnp.exp(s - m_safe[..., None]), 0.0)
        rescale = jnp.exp(jnp.where(jnp.isfinite(m), m - m_safe, -jnp.inf))
        total = rescale * total + jnp.sum(p, axis=-1)
        pv = jnp.einsum("bhqk,bhkd->bhqd", p.astype(v.dtype), v_blk, preferred_element_type=F32)
        acc = rescale[..., None] * acc + pv
        return (m_new, total, acc), None

    zeros, wide = _zeros_like_outputs(q, k, v, key_mask, dv)
    init = (zeros - jnp.inf, zeros, wide)
    count = k.shape[2] // at.config.block_k
    xs = (
        jnp.arange(count, dtype=jnp.int32),
        _key_blocks(k, at.config.block_k),
        _key_blocks(v, at.config.block_k),
        _mask_blocks(key_mask, at.config.block_k),
    )
    (m, total, acc), _ = lax.scan(step, init, xs)
    seen = total > 0
    safe = jnp.where(seen, total, 1.0)
    o = jnp.where(seen[..., None], acc / safe[..., None], 0.0)
    lse = jnp.where(seen, m + jnp.log(safe), 0.0)
    return (o.astype(q.dtype), lse), ()


def _tangent_rows(at: _Rows, rows: Arrays, keys: Arrays) -> RowsResult:
    """Rows (q, o, lse, dq), keys (k, v, key_mask, dk, dv) -> ((do, dlse), ()): the JVP.

    Ṡ = scale (dq kᵀ + q dkᵀ), μ_i = Σ_j P_ij Ṡ_ij = dlse_i and
    do_i = Σ_j P_ij (Ṡ_ij v_j + dv_j) - μ_i o_i (Lu & Song 2024, with o and lse saved).
    """
    (q, o, lse, dq), (k, v, key_mask, dk, dv) = rows, keys
    tq = q.shape[2]

    def block(start, k_blk, v_blk, dk_blk, dv_blk, mask_blk):  # type: ignore[no-untyped-def]
        p = at.probabilities(q, k_blk, lse, at.valid(mask_blk, start, tq))
        s_dot = at.scores(dq, k_blk) + at.scores(q, dk_blk)
        ps = p * s_dot
        mu = jnp.sum(ps, axis=-1)
        acc = jnp.einsum("bhqk,bhkd->bhqd", ps, v_blk.astype(F32)) + jnp.einsum(
            "bhqk,bhkd->bhqd", p, dv_blk.astype(F32)
        )
        return (acc, mu), None

    zeros, wide = _zeros_like_outputs(q, k, v, key_mask, o.shape[-1])
    zeros, wide = zeros + jnp.zeros_like(lse), wide + jnp.zeros_like(o, F32)
    zeros = zeros + jnp.zeros_like(dq[..., 0], F32) + jnp.zeros_like(dk[:, :, :1, 0], F32)
    init = (wide + jnp.zeros_like(dv[:, :, :1, :1], F32), zeros)
    (acc, mu), _ = at.scan_keys(block, init, (k, v, dk, dv), key_mask)
    do = acc - mu[..., None] * o.astype(F32)
    return (do.astype(q.dtype), mu), ()


def _vjp_rows(at: _Rows, rows: Arrays, keys: Arrays) -> RowsResult:
    """Rows (q, o, lse, g_o, g_lse), keys (k, v, key_mask) -> ((g_q,), (g_k, g_v)), all float32:
    the transpose of :func:`_tangent_rows`.

    δ_i = g_o_i · o_i, dS_ij = P_ij (g_o_i · v_j - δ_i + g_lse_i), g_q = scale dS k,
    g_k = scale dSᵀ q, g_v = Pᵀ g_o.
    """
    (q, o, lse, g_o, g_lse), (k, v, key_mask) = rows, keys
    tq = q.shape[2]
    g_o32 = g_o.astype(F32)
    delta = jnp.sum(g_o32 * o.astype(F32), axis=-1) - g_lse.astype(F32)

    def block(start, k_blk, v_blk, mask_blk):  # type: ignore[no-untyped-def]
        p = at.probabilities(q, k_blk, lse, at.valid(mask_blk, start, tq))
        dp = jnp.einsum("bhqd,bhkd->bhqk", g_o32, v_blk.astype(F32))
        ds = p * (dp - delta[..., None])
        g_q = at.config.scale * jnp.einsum("bhqk,bhkd->bhqd", ds, k_blk.astype(F32))
        g_k = at.config.scale * jnp.einsum("bhqk,bhqd->bhkd", ds, q.astype(F32))
        g_v = jnp.einsum("bhqk,bhqd->bhkd", p, g_o32)
        return (g_q,), (g_k, g_v)

    zeros, _ = _zeros_like_outputs(q, k, v, key_mask, 1)
    zeros = zeros + jnp.zeros_like(lse) + jnp.zeros_like(o[..., 0], F32)
    zeros = zeros + jnp.zeros_like(g_lse, F32)
    init = (zeros[..., None] + jnp.zeros_like(g_o[..., :1], F32) + jnp.zeros_like(q, F32),)
    (g_q,), (g_k, g_v) = at.scan_keys(block, init, (k, v), key_mask)
    return (g_q,), (_unblock(g_k), _unblock(g_v))  # the caller sums g_k, g_v over query blocks


# --- Query blocks: each pass above on one block of queries at a time ----------------------------


def _query_blocks(x: jax.Array, block_q: int) -> jax.Array:
    """(B, H, Tq, ...) -> (Tq / block_q, B, H, block_q, ...)."""
    b, h, t = x.shape[:3]
    return jnp.moveaxis(x.reshape(b, h, t // block_q, block_q, *x.shape[3:]), 2, 0)


def _unblock_queries(x: jax.Array) -> jax.Array:
    n, b, h, bq = x.shape[:4]
    return jnp.moveaxis(x, 0, 2).reshape(b, h, n * bq, *x.shape[4:])


def _typed_zeros(like: jax.Array, *inputs: jax.Array) -> jax.Array:
    """Float32 zeros of ``like``'s shape, varying and sharded like every input (see above)."""
    zeros = jnp.zeros_like(like, F32)
    for x in inputs:
        zeros = zeros + jnp.zeros_like(x.reshape(x.shape[:2] + (-1,))[..., :1], F32)[..., None]
    return zeros


def _per_query_block(
    rows_fn: Callable[[_Rows, Arrays, Arrays], RowsResult],
    rows: Arrays,
    keys: Arrays,
    config: Config,
    column_like: Arrays = (),
) -> tuple[list[jax.Array], list[jax.Array]]:
    """``rows_fn(at, row_blocks, keys) -> (row_outputs, column_sums)`` over blocks of
    ``block_q`` rows of ``rows``, rematerialised per block: row outputs concatenated, column sums
    (float32, shaped like ``column_like``) added."""
    block_q = config.block_q

    def on_block(q_start: Any, *row_blocks: jax.Array) -> RowsResult:
        return rows_fn(_Rows(config, q_start), row_blocks, keys)

    tq = rows[0].shape[2]
    if block_q >= tq:
        row_out, cols = on_block(0, *rows)
        return list(row_out), list(cols)
    body_fn = jax.checkpoint(on_block, prevent_cse=False)
    init = tuple(_typed_zeros(like, *rows) for like in column_like)

    def body(carry, xs):  # type: ignore[no-untyped-def]
        index, *blocks = xs
        row_out, cols = body_fn(index * block_q, *blocks)
        return tuple(c + d for c, d in zip(carry, cols, strict=True)), tuple(row_out)

    count = tq // block_q
    blocked = tuple(_query_blocks(x, block_q) for x in rows)
    cols, row_out = lax.scan(body, init, (jnp.arange(count, dtype=jnp.int32), *blocked))
    return [_unblock_queries(r) for r in row_out], list(cols)


def forward(*args: jax.Array, config: Config) -> tuple[jax.Array, jax.Array]:
    """(o (B, H, Tq, Dv) in q's dtype, lse (B, H, Tq) float32) of ``(q, k, v, key_mask)``,
    ``block_q`` queries at a time."""
    q, k, v, key_mask = args
    (o, lse), _ = _per_query_block(_forward_rows, (q,), (k, v, key_mask), config)
    return o, lse


def tangent(*args: jax.Array, config: Config) -> tuple[jax.Array, jax.Array]:
    """The JVP (:func:`_tangent_rows`) of ``(q, k, v, o, lse, key_mask, dq, dk, dv)``: (do in q's
    dtype, dlse float32), ``block_q`` queries at a time."""
    q, k, v, o, lse, key_mask, dq, dk, dv = args
    (do, dlse), _ = _per_query_block(
        _tangent_rows, (q, o, lse, dq), (k, v, key_mask, dk, dv), config
    )
    return do, dlse


def vjp(*args: jax.Array, config: Config) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The VJP (:func:`_vjp_rows`) of ``(q, k, v, o, lse, key_mask, g_o, g_lse)``: (g_q, g_k, g_v)
    in q's, k's, v's dtypes, ``block_q`` queries at a time, g_k and g_v summed over them."""
    q, k, v, o, lse, key_mask, g_o, g_lse = args
    rows = (q, o, lse, g_o, g_lse)
    (g_q,), (g_k, g_v) = _per_query_block(_vjp_rows, rows, (k, v, key_mask), config, (k, v))
    return g_q.astype(q.dtype), g_k.astype(k.dtype), g_v.astype(v.dtype)


# --- Second order: JAX's derivatives of the passes above in their primal inputs ----------------
# (q, k, v, o, lse): through the rematerialised loops, so they keep block memory too.


def tangent_jvp(*args: jax.Array, config: Config) -> Arrays:
    """The derivative of :func:`tangent`'s (do, dlse) along (q_dot, k_dot, v_dot, o_dot,
    lse_dot) at ``(q, k, v, o, lse, key_mask, dq, dk, dv, q_dot, k_dot, v_dot, o_dot, lse_dot)``."""
    primal, key_mask, d, dot = args[:5], args[5], args[6:9], args[9:]
    return tuple(jax.jvp(lambda *p: tangent(*p, key_mask, *d, config=config), primal, dot)[1])


def vjp_jvp(*args: jax.Array, config: Config) -> Arrays:
    """The derivative of :func:`vjp`'s (g_q, g_k, g_v) along (q_dot, k_dot, v_dot, o_dot, lse_dot)
    at ``(q, k, v, o, lse, key_mask, g_o, g_lse, q_dot, k_dot, v_dot, o_dot, lse_dot)``."""
    primal, key_mask, g, dot = args[:5], args[5], args[6:8], args[8:]
    return tuple(jax.jvp(lambda *p: vjp(*p, key_mask, *g, config=config), primal, dot)[1])


def second_vjp(*args: jax.Array, config: Config) -> Arrays:
    """The gradient in (q, k, v, o, lse) of <(g_o, g_lse), tangent(dq, dk, dv)> at
    ``(q, k, v, o, lse, key_mask, dq, dk, dv, g_o, g_lse)``: (q, k, v, o in their dtypes, lse
    float32)."""
    primal, key_mask, d, g = args[:5], args[5], args[6:9], args[9:]
    out, pullback = jax.vjp(lambda *p: tangent(*p, key_mask, *d, config=config), *primal)
    return tuple(pullback(tuple(c.astype(x.dtype) for c, x in zip(g, out, strict=True))))


PASSES: dict[str, Callable[..., Any]] = {
    "forward": forward,
    "tangent": tangent,
    "vjp": vjp,
    "tangent_jvp": tangent_jvp,
    "vjp_jvp": vjp_jvp,
    "second_vjp": second_vjp,
}

__all__ = ["PASSES", "forward", "second_vjp", "tangent", "tangent_jvp", "vjp", "vjp_jvp"]
