"""Per-sample norms and penalties of input-gradient rows: a Pallas forward with an exact jnp JVP.

    norms_and_penalties(rows, kind, target, backend) -> (norm (B,), penalty (B,))

The forward is the fused stats kernel of ``backend`` (one read of every row, float32
accumulation). The derivative is a ``custom_jvp`` written in plain ``jnp``:

    dn_b = <g_b, dg_b> / n_b        dp_b = p'(n_b) dn_b

so forward mode, reverse mode (JAX transposes the rule: the cotangent is the per-sample scale
``(ct_n + ct_p p'(n)) / n`` times g, an elementwise op XLA fuses into its neighbours) and every
higher order work, with the kernel on the primal path at each order. At g = 0 the norm is not
differentiable; we use dn/dg = 0 there (the subgradient of smallest norm), which keeps every
parameter gradient finite for dead or flat critics.
"""

import functools

import jax
import jax.numpy as jnp

from fastgp.backends import NORM_ROW, PENALTY_ROW, resolve_for
from fastgp.kernels import penalty_slope


def _tiny(dtype):
    return float(jnp.finfo(dtype).tiny)


def safe_inverse(norm):
    """``1 / norm`` where the norm is positive, 0 where it is 0 (differentiable, finite)."""
    positive = norm >= _tiny(norm.dtype)
    return jnp.where(positive, 1.0 / jnp.where(positive, norm, 1.0), 0.0)


def row_scale(norm, ct_norm, ct_penalty, kind, target):
    """(B,) factors s with ``d<ct, (norm, penalty)> / dg_b = s_b * g_b`` (0 where the norm is 0).

    ``d n_b / d g_b = g_b / n_b``, so ``s_b = (ct_norm_b + ct_penalty_b * p'(n_b)) / n_b``.
    """
    return (ct_norm + ct_penalty * penalty_slope(norm, kind, target)) * safe_inverse(norm)


def row_dots(rows, other_rows):
    """(B,) per-sample dot products over all leaves, accumulated in float32 (float64 for f64)."""
    dtype = jnp.result_type(jnp.float32, *(r.dtype for r in rows))
    return sum(jnp.sum(a.astype(dtype) * b.astype(dtype), axis=1)
               for a, b in zip(rows, other_rows))


@functools.partial(jax.custom_jvp, nondiff_argnums=(1, 2, 3))
def norms_and_penalties(rows, kind, target, backend):
    """Per-sample L2 norms over all leaves and the per-sample penalty of ``kind``.

    Args:
      rows: tuple of (B, D_i) float arrays (bf16/f16/f32, or f64 on XLA); sums accumulate in
        float32 (float64 for float64 input).
      kind, target: penalty kind and relative target (static).
      backend: backend name (see ``fastgp.backends``).

    Returns:
      (norm, penalty), each (B,) float32 (float64 for float64 input).
    """
    ops = resolve_for(backend, *rows)
    carry = None
    for leaf in rows[:-1]:
        carry = ops.stats(leaf, carry)
    stats = ops.stats(rows[-1], carry, kind=kind, target=target)
    return stats[NORM_ROW], stats[PENALTY_ROW]


@norms_and_penalties.defjvp
def _norms_and_penalties_jvp(kind, target, backend, primals, tangents):
    (rows,), (row_tangents,) = primals, tangents
    norm, penalty = norms_and_penalties(rows, kind, target, backend)
    d_norm = row_dots(rows, row_tangents) * safe_inverse(norm)
    d_penalty = penalty_slope(norm, kind, target) * d_norm
    return (norm, penalty), (d_norm, d_penalty)


__all__ = ["norms_and_penalties", "row_dots", "row_scale", "safe_inverse"]
