"""The zigzag token layout of causal sequence parallelism, and its inverse.

    to_zigzag(x, shards, axis=1)    -> x with its tokens in the order that split over ``shards``
                                       devices gives device i chunks i and 2n - 1 - i of 2n
    from_zigzag(x, shards, axis=1)  -> the sequence order back

With causal masking a contiguous split leaves the first device little work and the last the most;
in the zigzag order every device holds an early and a late chunk, and each ring step does the same
work on every device (``fastgp._attention.ring``). Reorder the tokens (and anything indexed by
them: positions, masks) before splitting them, and the outputs back after.
"""

import jax
import jax.numpy as jnp
import numpy as np


def _order(length: int, shards: int) -> np.ndarray:
    """The token indices of the zigzag order (ValueError unless 2 x shards divides length)."""
    if shards < 1 or length % (2 * shards):
        raise ValueError(
            f"fastgp.to_zigzag: {length} tokens cannot be cut into 2 x {shards} equal chunks; the "
            f"sequence length must be a multiple of {2 * shards}"
        )
    chunk = length // (2 * shards)
    chunks = [c for i in range(shards) for c in (i, 2 * shards - 1 - i)]
    return np.concatenate([np.arange(c * chunk, (c + 1) * chunk) for c in chunks])


def to_zigzag(x: jax.Array, shards: int, axis: int = 1) -> jax.Array:
    """``x`` with the tokens on ``axis`` in the zigzag order for ``shards`` devices (see module)."""
    return jnp.take(x, _order(x.shape[axis], shards), axis=axis)


def from_zigzag(x: jax.Array, shards: int, axis: int = 1) -> jax.Array:
    """The inverse of :func:`to_zigzag`."""
    return jnp.take(x, np.argsort(_order(x.shape[axis], shards)), axis=axis)


__all__ = ["from_zigzag", "to_zigzag"]
