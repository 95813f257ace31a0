"""The critic's input-gradient, the first half of every exact penalty."""

import jax
import jax.numpy as jnp

from fastgp._penalty import validation
from fastgp._typing import AxisName, Critic, PyTree


def input_gradients(
    critic: Critic, x: PyTree, *, axis_name: AxisName = None, sample_axis_name: AxisName = None
) -> tuple[jax.Array, PyTree]:
    """(scores (B,), d sum(scores) / dx) for a per-sample critic; gradients share x's structure.

    Inside ``shard_map`` with ``sample_axis_name``, x is this device's slice of every sample and
    the critic must return whole-sample scores, equal on every slice (a psum over the sample
    axes inside it); the gradients are then this slice's part of each sample's gradient.
    """
    _, batch = validation.leaves_of(x, "x")
    scores, pullback = jax.vjp(lambda y: validation.call_critic(critic, y), x)
    flat = validation.check_scores(scores, batch, x, axis_name, sample_axis_name)
    (grads,) = pullback(jnp.ones_like(scores))
    return flat, grads


__all__ = ["input_gradients"]
