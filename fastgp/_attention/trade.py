"""The all-to-all scheme's collectives: a token split over mesh axes traded for a head split.

    to_heads(x, axes, tokens_at, heads_at)   -> every token of 1 / n of x's heads
    to_tokens(x, axes, tokens_at, heads_at)  -> the inverse: 1 / n of the tokens of every head
    gathered_tokens(x, axes)                 -> every token of x's axis 1 (bthd, or a key mask)

``tokens_at`` and ``heads_at`` are x's token and head axes (1 and 2 in ``bthd``, 2 and 1 in
``bhtd``); n, the devices of ``axes``, divides x's heads (``config.heads_split``). Tokens come in
mesh order. Each trade is linear, its transpose the other, so every derivative follows.
"""

import jax
from jax import lax

from fastgp._sharding import collective_axis


def to_heads(x: jax.Array, axes: tuple[str, ...], tokens_at: int, heads_at: int) -> jax.Array:
    return lax.all_to_all(
        x, collective_axis(axes), split_axis=heads_at, concat_axis=tokens_at, tiled=True
    )


def to_tokens(x: jax.Array, axes: tuple[str, ...], tokens_at: int, heads_at: int) -> jax.Array:
    return lax.all_to_all(
        x, collective_axis(axes), split_axis=tokens_at, concat_axis=heads_at, tiled=True
    )


def gathered_tokens(x: jax.Array, axes: tuple[str, ...]) -> jax.Array:
    return lax.all_gather(x, collective_axis(axes), axis=1, tiled=True)


__all__ = ["gathered_tokens", "to_heads", "to_tokens"]
