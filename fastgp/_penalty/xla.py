"""The penalty's XLA path: per-sample sums of squares in plain jnp, which XLA fuses."""

import jax
import jax.numpy as jnp


def xla_sumsq(leaf: jax.Array) -> jax.Array:
    """(B,) sums of squares over every non-batch axis, plain jnp, float32 (float64 for float64)."""
    x = leaf.astype(jnp.result_type(jnp.float32, leaf.dtype))
    return jnp.sum(x * x, axis=tuple(range(1, leaf.ndim)))


__all__ = ["xla_sumsq"]
