"""fastgp: fused, distributed, second-order-safe gradient penalties for JAX on TPU."""

from fastgp.penalty import (
    grad_norms,
    gradient_penalty,
    gradient_penalty_and_norms,
    interpolate,
    penalty_from_grads,
)

__version__ = "0.1.0"

__all__ = [
    "grad_norms",
    "gradient_penalty",
    "gradient_penalty_and_norms",
    "interpolate",
    "penalty_from_grads",
]
