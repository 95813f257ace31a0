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

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

F32 = jnp.float32


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


def _valid(
    mask_blk: jax.Array, start: jax.Array, tq: int, causal: bool, q_start: Any = 0
) -> jax.Array:
    """(B, 1, Tq, block_k) bool: key padding and, if causal, j <= i (rows from ``q_start``)."""
    valid = mask_blk[:, None, None, :]
    if causal:
        rows = q_start + lax.broadcasted_iota(jnp.int32, (tq, mask_blk.shape[-1]), 0)
        cols = start + lax.broadcasted_iota(jnp.int32, (tq, mask_blk.shape[-1]), 1)
        valid = valid & (cols <= rows)[None, None]
    return valid


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


def _scores(q: jax.Array, k_blk: jax.Array, scale: float) -> jax.Array:
    return scale * jnp.einsum("bhqd,bhkd->bhqk", q, k_blk, preferred_element_type=F32)


def _probabilities(
    q: jax.Array,
    k_blk: jax.Array,
    lse: jax.Array,
    valid: jax.Array,
    scale: float,
) -> jax.Array:
    """(B, H, Tq, block_k) float32 P from the saved log-sum-exp."""
    s = _scores(q, k_blk, scale)
    return jnp.where(valid, jnp.exp(jnp.where(valid, s - lse[..., None], 0.0)), 0.0)


def _scan_key_blocks(
    block_fn: Callable[..., tuple[jax.Array, ...]],
    init: tuple[jax.Array, ...],
    blocked: tuple[jax.Array, ...],
    block_k: int,
) -> tuple[tuple[jax.Array, ...], Any]:
    """Sum ``block_fn(start, *blocks)[0]`` over key blocks; its second result is per block.

    ``block_fn`` returns (sums, per_block); it is rematerialised so that derivatives of the loop
    keep its inputs only.
    """
    body_fn = jax.checkpoint(block_fn, prevent_cse=False, static_argnums=())

    def body(carry: tuple[jax.Array, ...], xs: tuple[jax.Array, ...]):  # type: ignore[no-untyped-def]
        index, *blocks = xs
        sums, per_block = body_fn(index * block_k, *blocks)
        return tuple(c + s for c, s in zip(carry, sums, strict=True)), per_block

    count = blocked[0].shape[0]
    return lax.scan(body, init, (jnp.arange(count, dtype=jnp.int32), *blocked))


def _forward_rows(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    key_mask: jax.Array,
    *,
    scale: float,
    causal: bool,
    block_k: int,
    q_start: Any = 0,
) -> tuple[jax.Array, jax.Array]:
    """(o (B, H, Tq, Dv) in q's dtype, lse (B, H, Tq) float32) by online softmax."""
    tq = q.shape[2]
    dv = v.shape[-1]

    def step(carry, xs):  # type: ignore[no-untyped-def]
        m, total, acc = carry
        index, k_blk, v_blk, mask_blk = xs
        valid = _valid(mask_blk, index * block_k, tq, causal, q_start)
        s = jnp.where(valid, _scores(q, k_blk, scale), -jnp.inf)
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
        p = jnp.where(valid, jnp.exp(s - m_safe[..., None]), 0.0)
        rescale = jnp.exp(jnp.where(jnp.isfinite(m), m - m_safe, -jnp.inf))
        total = rescale * total + jnp.sum(p, axis=-1)
        pv = jnp.einsum("bhqk,bhkd->bhqd", p.astype(v.dtype), v_blk, preferred_element_type=F32)
        acc = rescale[..., None] * acc + pv
        return (m_new, total, acc), None

    rows, wide = _zeros_like_outputs(q, k, v, key_mask, dv)
    init = (rows - jnp.inf, rows, wide)
    count = k.shape[2] // block_k
    xs = (
        jnp.arange(count, dtype=jnp.int32),
        _key_blocks(k, block_k),
        _key_blocks(v, block_k),
        _mask_blocks(key_mask, block_k),
    )
    (m, total, acc), _ = lax.scan(step, init, xs)
    seen = total > 0
    safe = jnp.where(seen, total, 1.0)
    o = jnp.where(seen[..., None], acc / safe[..., None], 0.0)
    lse = jnp.where(seen, m + jnp.log(safe), 0.0)
    return o.astype(q.dtype), lse


def _tangent_rows(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    o: jax.Array,
    lse: jax.Array,
    key_mask: jax.Array,
    dq: jax.Array,
    dk: jax.Array,
    dv: jax.Array,
    *,
    scale: float,
    causal: bool,
    block_k: int,
    q_start: Any = 0,
) -> tuple[jax.Array, jax.Array]:
    """JVP: (do (B, H, Tq, Dv) in q's dtype, dlse (B, H, Tq) float32), linear in (dq, dk, dv).

    Ṡ = scale (dq kᵀ + q dkᵀ), μ_i = Σ_j P_ij Ṡ_ij = dlse_i and
    do_i = Σ_j P_ij (Ṡ_ij v_j + dv_j) - μ_i o_i (Lu & Song 2024, with o and lse saved).
    """
    tq = q.shape[2]

    def block(start, k_blk, v_blk, dk_blk, dv_blk, mask_blk):  # type: ignore[no-untyped-def]
        valid = _valid(mask_blk, start, tq, causal, q_start)
        p = _probabilities(q, k_blk, lse, valid, scale)
        s_dot = _scores(dq, k_blk, scale) + _scores(q, dk_blk, scale)
        ps = p * s_dot
        mu = jnp.sum(ps, axis=-1)
        acc = jnp.einsum("bhqk,bhkd->bhqd", ps, v_blk.astype(F32)) + jnp.einsum(
            "bhqk,bhkd->bhqd", p, dv_blk.astype(F32)
        )
        return (acc, mu), None

    rows, wide = _zeros_like_outputs(q, k, v, key_mask, o.shape[-1])
    rows, wide = rows + jnp.zeros_like(lse), wide + jnp.zeros_like(o, F32)
    rows = rows + jnp.zeros_like(dq[..., 0], F32) + jnp.zeros_like(dk[:, :, :1, 0], F32)
    init = (wide + jnp.zeros_like(dv[:, :, :1, :1], F32), rows)
    blocked = tuple(_key_blocks(x, block_k) for x in (k, v, dk, dv))
    (acc, mu), _ = _scan_key_blocks(
        block, init, (*blocked, _mask_blocks(key_mask, block_k)), block_k
    )
    do = acc - mu[..., None] * o.astype(F32)
    return do.astype(q.dtype), mu


def _vjp_rows(
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
    block_k: int,
    q_start: Any = 0,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Transpose of :func:`tangent`: (g_q, g_k, g_v) in q's, k's, v's dtypes.

    δ_i = g_o_i · o_i, dS_ij = P_ij (g_o_i · v_j - δ_i + g_lse_i), g_q = scale dS k,
    g_k = scale dSᵀ q, g_v = Pᵀ g_o.
    """
    tq = q.shape[2]
    g_o32 = g_o.astype(F32)
    delta = jnp.sum(g_o32 * o.astype(F32), axis=-1) - g_lse.astype(F32)

    def block(start, k_blk, v_blk, mask_blk):  # type: ignore[no-untyped-def]
        valid = _valid(mask_blk, start, tq, causal, q_start)
        p = _probabilities(q, k_blk, lse, valid, scale)
        dp = jnp.einsum("bhqd,bhkd->bhqk", g_o32, v_blk.astype(F32))
        ds = p * (dp - delta[..., None])
        g_q = scale * jnp.einsum("bhqk,bhkd->bhqd", ds, k_blk.astype(F32))
        g_k = scale * jnp.einsum("bhqk,bhqd->bhkd", ds, q.astype(F32))
        g_v = jnp.einsum("bhqk,bhqd->bhkd", p, g_o32)
        return (g_q,), (g_k, g_v)

    rows, _ = _zeros_like_outputs(q, k, v, key_mask, 1)
    rows = rows + jnp.zeros_like(lse) + jnp.zeros_like(o[..., 0], F32) + jnp.zeros_like(g_lse, F32)
    init = (rows[..., None] + jnp.zeros_like(g_o[..., :1], F32) + jnp.zeros_like(q, F32),)
    blocked = (_key_blocks(k, block_k), _key_blocks(v, block_k), _mask_blocks(key_mask, block_k))
    (g_q,), (g_k, g_v) = _scan_key_blocks(block, init, blocked, block_k)
    return g_q, _unblock(g_k), _unblock(g_v)  # float32: the caller sums over query blocks


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
    rows_fn: Callable[..., Any],
    row_args: tuple[jax.Array, ...],
    block_q: int,
    column_like: tuple[jax.Array, ...] = (),
) -> tuple[list[jax.Array], list[jax.Array]]:
    """``rows_fn(q_start, *row_blocks) -> (row_outputs, column_sums)`` over query blocks,
    rematerialised per block: row outputs concatenated, column sums (float32, shaped like
    ``column_like``) added."""
    tq = row_args[0].shape[2]
    if block_q >= tq:
        rows, cols = rows_fn(0, *row_args)
        return list(rows), list(cols)
    body_fn = jax.checkpoint(rows_fn, prevent_cse=False)
    init = tuple(_typed_zeros(like, *row_args) for like in column_like)

    def body(carry, xs):  # type: ignore[no-untyped-def]
        index, *blocks = xs
        rows, cols = body_fn(index * block_q, *blocks)
        return tuple(c + d for c, d in zip(carry, cols, strict=True)), tuple(rows)

    count = tq // block_q
    blocked = tuple(_query_blocks(x, block_q) for x in row_args)
    cols, rows = lax.scan(body, init, (jnp.arange(count, dtype=jnp.int32), *blocked))
    return [_unblock_queries(r) for r in rows], list(cols)


def forward(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    key_mask: jax.Array,
    *,
    scale: float,
    causal: bool,
    block_q: int,
    block_k: int,
) -> tuple[jax.Array, jax.Array]:
    """(o (B, H, Tq, Dv) in q's dtype, lse (B, H, Tq) float32), ``block_q`` queries at a time."""
    kw: dict[str, Any] = dict(scale=scale, causal=causal, block_k=block_k)
    (o, lse), _ = _per_query_block(
        lambda start, q: (_forward_rows(q, k, v, key_mask, q_start=start, **kw), ()), (q,), block_q
    )
    return o, lse


def tangent(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    o: jax.Array,
    lse: jax.Array,
    key_mask: jax.Array,
    dq: jax.Array,
    dk: jax.Array,
    dv: jax.Array,
    *,
    scale: float,
    causal: bool,
    block_q: int,
    block_k: int,
) -> tuple[jax.Array, jax.Array]:
    """The JVP (:func:`_tangent_rows`), ``block_q`` queries at a time."""
    kw: dict[str, Any] = dict(scale=scale, causal=causal, block_k=block_k)

    def rows(start, q, o, lse, dq):  # type: ignore[no-untyped-def]
        return _tangent_rows(q, k, v, o, lse, key_mask, dq, dk, dv, q_start=start, **kw), ()

    (do, dlse), _ = _per_query_block(rows, (q, o, lse, dq), block_q)
    return do, dlse


def vjp(
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
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The VJP (:func:`_vjp_rows`), ``block_q`` queries at a time, g_k and g_v summed over them."""
    kw: dict[str, Any] = dict(scale=scale, causal=causal, block_k=block_k)

    def rows(start, q, o, lse, g_o, g_lse):  # type: ignore[no-untyped-def]
        g_q, g_k, g_v = _vjp_rows(q, k, v, o, lse, key_mask, g_o, g_lse, q_start=start, **kw)
        return (g_q,), (g_k, g_v)

    (g_q,), (g_k, g_v) = _per_query_block(rows, (q, o, lse, g_o, g_lse), block_q, (k, v))
    return g_q.astype(q.dtype), g_k.astype(k.dtype), g_v.astype(v.dtype)


PASSES: dict[str, Callable[..., Any]] = {"forward": forward, "tangent": tangent, "vjp": vjp}

__all__ = ["PASSES", "forward", "tangent", "vjp"]
