"""The naive jnp gradient penalty, written the way most trainers write it. Kept as the oracle.

No kernels, no custom VJPs: ``jax.grad`` of the summed critic output, ``sqrt(sum(g ** 2))`` per
sample (in float32, or float64), the penalty, the mean. Its backward divides by the norm, so a
sample with a zero input-gradient turns every parameter gradient into NaN; that is the failure
fastgp removes.
"""

import jax
import jax.numpy as jnp

from fastgp._penalty.kinds import DEFAULT_WEIGHT
from fastgp._typing import Critic, Kind, PyTree


def naive_grad_norms(grads: PyTree) -> jax.Array:
    """(B,) per-sample L2 norms, plain jnp, in float32 (float64 for float64 input)."""
    leaves = jax.tree.leaves(grads)
    dtype = jnp.result_type(jnp.float32, *(leaf.dtype for leaf in leaves))
    # Summed over the non-batch axes in place (no reshape to (B, D)), so that it also runs under
    # explicit sharding with a non-batch axis sharded.
    sumsq = sum(
        jnp.sum(jnp.square(leaf.astype(dtype)), axis=tuple(range(1, leaf.ndim))) for leaf in leaves
    )
    return jnp.sqrt(sumsq)


def naive_penalties(norms: jax.Array, *, kind: Kind = "wgan-gp", target: float = 1.0) -> jax.Array:
    """Per-sample penalty of a (B,) norm vector."""
    if kind == "wgan-gp":
        return (norms / target - 1.0) ** 2
    if kind == "wgan-lp":
        return jnp.maximum(0.0, norms / target - 1.0) ** 2
    if kind == "r1":
        return norms**2
    raise ValueError(f"unknown penalty kind {kind!r}")


def naive_penalty_from_grads(
    grads: PyTree,
    *,
    kind: Kind = "wgan-gp",
    target: float = 1.0,
    weight: float | jax.Array = DEFAULT_WEIGHT,
) -> jax.Array:
    """weight * mean_b p(n_b) on one device."""
    return weight * jnp.mean(naive_penalties(naive_grad_norms(grads), kind=kind, target=target))


def naive_gradient_penalty(
    critic: Critic,
    x: PyTree,
    *,
    kind: Kind = "wgan-gp",
    target: float = 1.0,
    weight: float | jax.Array = DEFAULT_WEIGHT,
) -> jax.Array:
    """Nested-``jax.grad`` gradient penalty of ``critic`` at ``x`` (one device, whole batch)."""
    grads = jax.grad(lambda y: jnp.sum(critic(y)))(x)
    return naive_penalty_from_grads(grads, kind=kind, target=target, weight=weight)
