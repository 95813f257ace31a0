"""The per-sample penalty as a function of the input-gradient norm, and its slope.

Plain ``jnp`` on float32 (or float64) arrays of any matching shape; it runs after the per-sample
sums of squares, whichever backend computed them.
"""

from typing import get_args

import jax
import jax.numpy as jnp

from fastgp._typing import Kind

KINDS: tuple[Kind, ...] = get_args(Kind)
DEFAULT_WEIGHT = 10.0  # lambda of Gulrajani et al. (2017), the default of every penalty


def penalty_of_norm(sumsq: jax.Array, norm: jax.Array, kind: Kind, target: float) -> jax.Array:
    """p(n): ``(n/t - 1)^2`` (wgan-gp), ``max(0, n/t - 1)^2`` (wgan-lp), ``n^2`` (r1)."""
    if kind == "wgan-gp":
        return jnp.square(norm * (1.0 / target) - 1.0)
    if kind == "wgan-lp":
        return jnp.square(jnp.maximum(norm * (1.0 / target) - 1.0, 0.0))
    if kind == "r1":
        return sumsq
    raise ValueError(f"unknown penalty kind {kind!r}; expected one of {KINDS}")


def penalty_slope(norm: jax.Array, kind: Kind, target: float) -> jax.Array:
    """dp/dn for :func:`penalty_of_norm`, elementwise."""
    if kind == "wgan-gp":
        return (2.0 / target) * (norm * (1.0 / target) - 1.0)
    if kind == "wgan-lp":
        return (2.0 / target) * jnp.maximum(norm * (1.0 / target) - 1.0, 0.0)
    if kind == "r1":
        return 2.0 * norm
    raise ValueError(f"unknown penalty kind {kind!r}; expected one of {KINDS}")
