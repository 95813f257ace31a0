"""Type aliases for the library's signatures."""

from collections.abc import Callable
from typing import Any, TypeAlias

import jax

# An array or a pytree of arrays: pytrees have no static type, so this is Any.
PyTree: TypeAlias = Any
# A mesh axis name or a tuple of them inside shard_map; None outside, () for a per-shard value.
AxisName: TypeAlias = str | tuple[str, ...] | None
# x (a pytree of (B, ...) arrays) -> scores of shape (B,) or (B, 1).
Critic: TypeAlias = Callable[[Any], jax.Array]
