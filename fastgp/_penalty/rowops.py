"""Per-sample norms and penalties of input-gradient leaves: a Pallas forward with an exact jnp JVP.

    norms_and_penalties(leaves, RowOptions(kind, target, backend)) -> (norm (B,), penalty (B,))

``leaves`` are the input-gradient's leaves, each (B, ...) in its own shape. The forward
sums squares per sample with ``backend`` (one read of every leaf, in its own layout, float32
accumulation; see ``binding``), then takes the norm and the penalty in jnp. The derivative is a
``custom_jvp`` written in plain ``jnp``:

    dn_b = <g_b, dg_b> / n_b        dp_b = p'(n_b) dn_b

so forward mode, reverse mode (JAX transposes the rule: the cotangent is the per-sample scale
``(ct_n + ct_p p'(n)) / n`` times g, an elementwise op XLA fuses into its neighbours) and every
higher order work, with the kernel on the primal path at each order. At g = 0 the norm is not
differentiable; we use dn/dg = 0 there (the subgradient of smallest norm), which keeps every
parameter gradient finite for dead or flat critics.
"""

import dataclasses
import functools
import operator
from collections.abc import Sequence
from typing import cast

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fastgp._penalty.binding import resolve_for
from fastgp._penalty.kinds import penalty_of_norm, penalty_slope
from fastgp._typing import Backend, Kind


def _tiny(dtype: np.dtype) -> float:
    return float(jnp.finfo(dtype).tiny)


def safe_inverse(norm: jax.Array) -> jax.Array:
    """``1 / norm`` where the norm is positive, 0 where it is 0 (differentiable, finite)."""
    positive = norm >= _tiny(norm.dtype)
    return jnp.where(positive, 1.0 / jnp.where(positive, norm, 1.0), 0.0)


def row_scale(
    norm: jax.Array, ct_norm: jax.Array, ct_penalty: jax.Array, kind: Kind, target: float
) -> jax.Array:
    """(B,) factors s with ``d<ct, (norm, penalty)> / dg_b = s_b * g_b`` (0 where the norm is 0).

    ``d n_b / d g_b = g_b / n_b``, so ``s_b = (ct_norm_b + ct_penalty_b * p'(n_b)) / n_b``.
    """
    return (ct_norm + ct_penalty * penalty_slope(norm, kind, target)) * safe_inverse(norm)


def row_dots(leaves: Sequence[jax.Array], other_leaves: Sequence[jax.Array]) -> jax.Array:
    """(B,) per-sample dot products over all leaves, accumulated in float32 (float64 for f64)."""
    dtype = jnp.result_type(jnp.float32, *(leaf.dtype for leaf in leaves))
    dots = sum(
        jnp.sum(a.astype(dtype) * b.astype(dtype), axis=tuple(range(1, a.ndim)))
        for a, b in zip(leaves, other_leaves, strict=True)
    )
    return cast(jax.Array, dots)  # an array, not sum()'s 0: there is at least one leaf


def _over_sample_axes(per_sample: jax.Array, sample_axes: tuple[str, ...]) -> jax.Array:
    """A per-sample sum completed over the mesh axes that split each sample (inside shard_map)."""
    return lax.psum(per_sample, sample_axes) if sample_axes else per_sample


@dataclasses.dataclass(frozen=True)
class RowOptions:
    """What a per-sample norm and penalty need besides the leaves: the kind and relative target,
    the backend that sums the squares, and (inside shard_map) the mesh axes that split each
    sample, over which the sums are psum'd. Hashable: a static argument."""

    kind: Kind
    target: float
    backend: Backend
    sample_axes: tuple[str, ...] = ()


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def norms_and_penalties(
    leaves: tuple[jax.Array, ...], options: RowOptions
) -> tuple[jax.Array, jax.Array]:
    """Per-sample L2 norms over all leaves and the per-sample penalty of ``options.kind``.

    ``leaves``: (B, ...) float arrays (bf16/f16/f32, or f64 on XLA), this device's slice of
    every sample along ``options.sample_axes``; sums accumulate in float32 (float64 for float64).
    Returns (norm, penalty), each (B,) float32 (float64 for float64 input), whole-sample values.
    """
    sumsq = resolve_for(options.backend, *leaves)
    local = functools.reduce(operator.add, (sumsq(leaf) for leaf in leaves))
    total = _over_sample_axes(local, options.sample_axes)
    norm = jnp.sqrt(total)
    return norm, penalty_of_norm(total, norm, options.kind, options.target)


@norms_and_penalties.defjvp
def _norms_and_penalties_jvp(
    options: RowOptions,
    primals: tuple[tuple[jax.Array, ...]],
    tangents: tuple[tuple[jax.Array, ...]],
) -> tuple[tuple[jax.Array, jax.Array], tuple[jax.Array, jax.Array]]:
    (leaves,), (leaf_tangents,) = primals, tangents
    norm, penalty = norms_and_penalties(leaves, options)
    dots = _over_sample_axes(row_dots(leaves, leaf_tangents), options.sample_axes)
    d_norm = dots * safe_inverse(norm)
    d_penalty = penalty_slope(norm, options.kind, options.target) * d_norm
    return (norm, penalty), (d_norm, d_penalty)


__all__ = ["RowOptions", "norms_and_penalties", "row_dots", "row_scale", "safe_inverse"]
