"""fastgp: exact, distributed gradient penalties for GAN critics in JAX, on TPU, GPU and CPU.

The library is this package minus ``fastgp.train`` (the training application):

    from fastgp import gradient_penalty, interpolate
    penalty = gradient_penalty(lambda x: critic(params, x), interpolate(key, real, fake))
"""

from fastgp._approximate.api import approximate_r1 as approximate_r1
from fastgp._attention.api import attention as attention
from fastgp._attention.reference import naive_attention as naive_attention
from fastgp._attention.zigzag import from_zigzag as from_zigzag
from fastgp._attention.zigzag import to_zigzag as to_zigzag
from fastgp._backends import attention_backend as attention_backend
from fastgp._critic_ops import FirstOrderOnlyOpError as FirstOrderOnlyOpError
from fastgp._penalty.reference import naive_gradient_penalty as naive_gradient_penalty
from fastgp._penalty.reference import naive_penalty_from_grads as naive_penalty_from_grads
from fastgp.penalty import DEFAULT_WEIGHT as DEFAULT_WEIGHT
from fastgp.penalty import SECOND_ORDER as SECOND_ORDER
from fastgp.penalty import grad_norms as grad_norms
from fastgp.penalty import gradient_penalty as gradient_penalty
from fastgp.penalty import gradient_penalty_and_norms as gradient_penalty_and_norms
from fastgp.penalty import input_gradients as input_gradients
from fastgp.penalty import interpolate as interpolate
from fastgp.penalty import penalty_and_norms_from_grads as penalty_and_norms_from_grads
from fastgp.penalty import penalty_from_grads as penalty_from_grads
from fastgp.penalty import per_sample_penalties as per_sample_penalties

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_WEIGHT",
    "FirstOrderOnlyOpError",
    "SECOND_ORDER",
    "attention",
    "attention_backend",
    "approximate_r1",
    "from_zigzag",
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
    "to_zigzag",
]
