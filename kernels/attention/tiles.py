"""The score-tile algebra of every attention pass, written once for every kernel that runs it.

A kernel holds a tile of scores in one of two orientations: query-major (rows are queries,
columns keys: S = scale q k^T) or key-major (rows are keys, columns queries: S^T = scale k q^T,
as the kernels that accumulate over queries hold it). ``Tiles`` multiplies a query-side and a
key-side operand into a tile of that orientation, so each pass's formulas below serve both
orientations and both the TPU (Mosaic) and GPU (Triton) kernels. Row statistics (lse, c, ...)
arrive already broadcastable against the tile: a column for query-major tiles, a row for
key-major ones. Everything is float32; matmul operands stay in their input dtype.
"""

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax

NEG = -1e30  # a float32 "minus infinity": exp(NEG - x) == 0 for any moderate x, and no inf - inf
NT = (((1,), (1,)), ((), ()))  # contract the last dims: a @ b.T
NN = (((1,), (0,)), ((), ()))  # a @ b


def nt(a: jax.Array, b: jax.Array) -> jax.Array:
    return lax.dot_general(a, b, NT, preferred_element_type=jnp.float32)


def nn(a: jax.Array, b: jax.Array) -> jax.Array:
    return lax.dot_general(a, b, NN, preferred_element_type=jnp.float32)


def accumulate(tile: jax.Array, other: jax.Array) -> jax.Array:
    """tile @ other in float32, the tile cast to ``other``'s dtype (as flash attention does)."""
    return nn(tile.astype(other.dtype), other)


def row_dots(a: jax.Array, b: jax.Array) -> jax.Array:
    """(..., T) float32 dot products of the rows of two (..., T, W) arrays: a query's g_o.o."""
    return jnp.sum(a.astype(jnp.float32) * b.astype(jnp.float32), axis=-1)


@dataclasses.dataclass(frozen=True)
class Tiles:
    """Score-shaped products in one orientation, and the passes' tiles built from them."""

    scale: float
    key_major: bool = False

    def outer(self, query_side: jax.Array, key_side: jax.Array) -> jax.Array:
        """The tile of query_side . key_side products: (bq, bk), or (bk, bq) key-major."""
        return nt(key_side, query_side) if self.key_major else nt(query_side, key_side)

    def along(self, q: jax.Array, k: jax.Array, dq: jax.Array, dk: jax.Array) -> jax.Array:
        """scale (dq k^T + q dk^T): the scores' derivative along (dq, dk)."""
        return self.scale * (self.outer(dq, k) + self.outer(q, dk))

    def probabilities(
        self, q: jax.Array, k: jax.Array, valid: jax.Array, lse: jax.Array
    ) -> jax.Array:
        """P = exp(S - lse) where valid, else 0."""
        return jnp.exp(jnp.where(valid, self.scale * self.outer(q, k) - lse, NEG))

    def ds(self, p: jax.Array, g_o: jax.Array, v: jax.Array, c: jax.Array) -> jax.Array:
        """The VJP's dS = P (g_o v^T - c), c = g_o.o - g_lse per query."""
        return p * (self.outer(g_o, v) - c)


def second_vjp(
    t: Tiles, p: jax.Array, q: jax.Array, k: jax.Array, *args: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(dS, A, P Sdot) of the second-order VJP: args v, dq, dk, dv, g_o, c."""
    v, dq, dk, dv, g_o, c = args
    s_dot = t.along(q, k, dq, dk)
    ds = t.ds(p, g_o, v, c)
    return ds, ds * s_dot + p * t.outer(g_o, dv), p * s_dot


def vjp_jvp(
    t: Tiles, p: jax.Array, q: jax.Array, k: jax.Array, *args: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(dS, dS', P') of the VJP's derivative along the primal direction: args v, q_dot, k_dot,
    v_dot, g_o, lse_dot, c, c_dot (c_dot = g_o.o_dot)."""
    v, q_dot, k_dot, v_dot, g_o, lse_dot, c, c_dot = args
    p_prime = p * (t.along(q, k, q_dot, k_dot) - lse_dot)
    dp_c = t.outer(g_o, v) - c
    ds_prime = p_prime * dp_c + p * (t.outer(g_o, v_dot) - c_dot)
    return p * dp_c, ds_prime, p_prime


def tangent_jvp(
    t: Tiles, p: jax.Array, q: jax.Array, k: jax.Array, *args: jax.Array
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(P Sdot, M = P' Sdot + P Sdot', P') of the tangent's derivative along the primal
    direction: args dq, dk, q_dot, k_dot, lse_dot."""
    dq, dk, q_dot, k_dot, lse_dot = args
    s_dot = t.along(q, k, dq, dk)
    p_prime = p * (t.along(q, k, q_dot, k_dot) - lse_dot)
    return p * s_dot, p_prime * s_dot + p * t.along(q_dot, k_dot, dq, dk), p_prime


__all__ = [
    "NEG",
    "Tiles",
    "accumulate",
    "nn",
    "nt",
    "row_dots",
    "second_vjp",
    "tangent_jvp",
    "vjp_jvp",
]
