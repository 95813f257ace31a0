"""fastgp: fused, distributed, second-order-exact gradient penalties for JAX on TPU.

The library is this package minus ``fastgp.train`` (the training application):

    from fastgp import gradient_penalty, interpolate
    penalty = gradient_penalty(lambda x: critic(params, x), interpolate(key, real, fake))
"""

from fastgp._approximate import approximate_r1
from fastgp._attention import attention, attention_backend
from fastgp._attention_reference import naive_attention
from fastgp._critic_ops import FirstOrderOnlyOpError
from fastgp._reference import naive_gradient_penalty, naive_penalty_from_grads
from fastgp.penalty import (
    DEFAULT_WEIGHT,
    SECOND_ORDER,
    grad_norms,
    gradient_penalty,
    gradient_penalty_and_norms,
    input_gradients,
    interpolate,
    penalty_and_norms_from_grads,
    penalty_from_grads,
    per_sample_penalties,
)

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_WEIGHT",
    "FirstOrderOnlyOpError",
    "SECOND_ORDER",
    "attention",
    "attention_backend",
    "approximate_r1",
    "grad_norms",
    "gradient_penalty",
    "gradient_penalty_and_norms",
    "input_gradients",
    "interpolate",
    "naive_attention",
    "naive_gradient_penalty",
    "naive_penalty_from_grads",
    "penalty_and_norms_from_grads",
    "penalty_from_grads",
    "per_sample_penalties",
]
