"""Type aliases for the library's signatures, and the option types whose values are fixed.

The option tuples are derived from these: ``fastgp._penalty.kinds.KINDS``,
``fastgp._backends.BACKENDS``, ``fastgp.penalty.SECOND_ORDER`` and the keys of
``fastgp.penalty.REMAT_POLICIES``.
"""

from collections.abc import Callable
from typing import Any, Literal, TypeAlias

import jax

# An array or a pytree of arrays: pytrees have no static type, so this is Any.
PyTree: TypeAlias = Any
# A mesh axis name or a tuple of them inside shard_map; None outside, () for a per-shard value.
AxisName: TypeAlias = str | tuple[str, ...] | None
# x (a pytree of (B, ...) arrays) -> scores of shape (B,) or (B, 1).
Critic: TypeAlias = Callable[[Any], jax.Array]

# The penalty kinds (``fastgp._penalty.kinds``).
Kind: TypeAlias = Literal["wgan-gp", "wgan-lp", "r1"]
# The backend names (``fastgp._backends`` resolves them, "auto" included).
Backend: TypeAlias = Literal["auto", "pallas", "interpret", "tpu-interpret", "gpu-interpret", "xla"]
# How the penalty's parameter gradient is taken (``fastgp.penalty.gradient_penalty``).
SecondOrder: TypeAlias = Literal["reverse-over-forward", "reverse"]
# A ``jax.checkpoint`` policy for the critic's activations; None: no rematerialisation.
RematPolicy: TypeAlias = Literal["nothing", "dots"]
Remat: TypeAlias = RematPolicy | None

__all__ = ["AxisName", "Backend", "Critic", "Kind", "PyTree", "Remat", "RematPolicy", "SecondOrder"]
