"""Global-batch reductions inside ``shard_map``: the penalty is a mean over the global batch."""

import jax.numpy as jnp
from jax import lax


def global_mean(values, axis_name=None):
    """Mean of a (B_local,) array over the global batch.

    Without ``axis_name`` this is ``jnp.mean``. With it (inside ``shard_map``), it is
    ``psum(sum) / psum(count)``: exact for any shard sizes, and identical on every shard.
    """
    total = jnp.sum(values, dtype=jnp.float32)
    count = jnp.float32(values.shape[0])
    if axis_name is not None:
        total = lax.psum(total, axis_name)
        count = lax.psum(count, axis_name)
    return total / count


def global_batch_slice(values, local_batch, axis_name):
    """This shard's contiguous slice of a global-batch array (leading axis = global batch)."""
    start = lax.axis_index(axis_name) * local_batch
    return lax.dynamic_slice_in_dim(values, start, local_batch, axis=0)
