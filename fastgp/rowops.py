"""Differentiable per-sample row operations, each a ``custom_vjp`` whose backward is a kernel.

    norms_and_penalties(leaves) -> (norm (B,), penalty (B,))    forward: fused stats kernel
    scale_rows(s, g)            -> s[b] * g[b, :]                the backward of the above
    row_dot(a, b)               -> sum_d a[b, d] * b[b, d]       the backward of scale_rows

Each forward rule calls its own custom_vjp function and each backward rule is built only from
these three functions and ``jnp``, so derivatives of any order stay on the kernels (and never reach
a raw ``pallas_call``, which has no autodiff rule).

At g = 0 the norm is not differentiable; we use dn/dg = 0 there (the subgradient of smallest
norm), which keeps every parameter gradient finite for dead or flat critics.
"""

import functools

import jax
import jax.numpy as jnp

from fastgp.backends import NORM_ROW, PENALTY_ROW, resolve
from fastgp.kernels import penalty_slope

_TINY = float(jnp.finfo(jnp.float32).tiny)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2, 3))
def norms_and_penalties(leaves, kind, target, backend):
    """Per-sample L2 norms over all leaves and the per-sample penalty of ``kind``.

    Args:
      leaves: tuple of (B, D_i) float arrays (bf16/f16/f32); sums accumulate in float32.
      kind, target: penalty kind and relative target (static).
      backend: backend name (see ``fastgp.backends``).

    Returns:
      (norm, penalty), each (B,) float32.
    """
    ops = resolve(backend)
    carry = None
    for leaf in leaves[:-1]:
        carry = ops.stats(leaf, carry)
    stats = ops.stats(leaves[-1], carry, kind=kind, target=target)
    return stats[NORM_ROW], stats[PENALTY_ROW]


def _norms_fwd(leaves, kind, target, backend):
    norm, penalty = norms_and_penalties(leaves, kind, target, backend)
    return (norm, penalty), (leaves, norm)


def _norms_bwd(kind, target, backend, residuals, cotangents):
    leaves, norm = residuals
    ct_norm, ct_penalty = cotangents
    positive = norm >= _TINY
    inverse_norm = jnp.where(positive, 1.0 / jnp.where(positive, norm, 1.0), 0.0)
    slope = penalty_slope(norm, kind, target)
    scale = (ct_norm + ct_penalty * slope) * inverse_norm
    return (tuple(scale_rows(scale, leaf, backend) for leaf in leaves),)


norms_and_penalties.defvjp(_norms_fwd, _norms_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def scale_rows(scale, g, backend):
    """(B,) float32 ``scale`` times the rows of (B, D) ``g``; result in g's dtype."""
    return resolve(backend).scale(scale, g)


def _scale_fwd(scale, g, backend):
    return scale_rows(scale, g, backend), (scale, g)


def _scale_bwd(backend, residuals, ct):
    scale, g = residuals
    return row_dot(g, ct, backend), scale_rows(scale, ct, backend).astype(g.dtype)


scale_rows.defvjp(_scale_fwd, _scale_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def row_dot(a, b, backend):
    """(B,) float32 per-sample dot products of two (B, D) arrays."""
    return resolve(backend).dot(a, b)


def _dot_fwd(a, b, backend):
    return row_dot(a, b, backend), (a, b)


def _dot_bwd(backend, residuals, ct):
    a, b = residuals
    return (scale_rows(ct, b, backend).astype(a.dtype),
            scale_rows(ct, a, backend).astype(b.dtype))


row_dot.defvjp(_dot_fwd, _dot_bwd)
