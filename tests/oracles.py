"""Independent oracles: float64 numpy norms and penalties per sample, and JAX's own derivatives
of a loss in its parameters."""

import jax
import numpy as np


def value_grad_hvp(loss, params, tangent):
    """``loss(params)``, its gradient and its Hessian-vector product along ``tangent``, from one
    ``jax.jvp`` of ``jax.value_and_grad`` (whose primal is the value and gradient)."""
    (value, grads), (_, hvp) = jax.jvp(jax.value_and_grad(loss), (params,), (tangent,))
    return value, grads, hvp


def rows64(tree_leaves):
    """Concatenate leaves (B, ...) into one (B, D) float64 array."""
    batch = tree_leaves[0].shape[0]
    return np.concatenate(
        [np.asarray(leaf, np.float64).reshape(batch, -1) for leaf in tree_leaves], axis=1
    )


def norms64(tree_leaves):
    return np.sqrt(np.sum(rows64(tree_leaves) ** 2, axis=1))


def penalties64(norms, kind, target):
    if kind == "wgan-gp":
        return (norms / target - 1.0) ** 2
    if kind == "wgan-lp":
        return np.maximum(0.0, norms / target - 1.0) ** 2
    if kind == "r1":
        return norms**2
    raise ValueError(kind)
