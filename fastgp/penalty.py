"""The gradient penalty: ``import fastgp.penalty`` or ``from fastgp.penalty import ...``.

    gradient_penalty(critic, x, *, kind, target, weight, ...)   -> scalar
    penalty_from_grads(grads, *, kind, target, weight, ...)     -> scalar
    grad_norms(grads)                                           -> (B,) per-sample L2 norms
    interpolate(key, real, fake)                                -> x_hat, alpha ~ U[0, 1] per sample

The op lives in ``fastgp._penalty`` (``api``, ``reference``, ``xla``, ``rowops``,
``second_order``, ``sharding``, ``binding``); this module is its public face.
"""

from fastgp._penalty.api import REMAT_POLICIES as REMAT_POLICIES
from fastgp._penalty.api import SECOND_ORDER as SECOND_ORDER
from fastgp._penalty.api import grad_norms as grad_norms
from fastgp._penalty.api import gradient_penalty as gradient_penalty
from fastgp._penalty.api import gradient_penalty_and_norms as gradient_penalty_and_norms
from fastgp._penalty.api import interpolate as interpolate
from fastgp._penalty.api import penalty_and_norms_from_grads as penalty_and_norms_from_grads
from fastgp._penalty.api import penalty_from_grads as penalty_from_grads
from fastgp._penalty.api import per_sample_penalties as per_sample_penalties
from fastgp._penalty.api import remat_critic as remat_critic
from fastgp._penalty.gradients import input_gradients as input_gradients
from fastgp._penalty.kinds import DEFAULT_WEIGHT as DEFAULT_WEIGHT

__all__ = [
    "DEFAULT_WEIGHT",
    "REMAT_POLICIES",
    "SECOND_ORDER",
    "grad_norms",
    "gradient_penalty",
    "gradient_penalty_and_norms",
    "input_gradients",
    "interpolate",
    "penalty_and_norms_from_grads",
    "penalty_from_grads",
    "per_sample_penalties",
    "remat_critic",
]
