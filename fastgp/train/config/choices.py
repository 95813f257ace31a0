"""The names a configuration field may take, and the ranges of its numbers.

TRAIN_KINDS, CONFIG_SECOND_ORDER, PRECISIONS, CRITICS   the choices (and their type aliases)
INT32_MAX, SEED_RANGE                                   the counters' and the seed's bounds
"""

from typing import Literal, TypeAlias

import jax.numpy as jnp

from fastgp.options import KINDS, SECOND_ORDER, Kind, SecondOrder
from fastgp.train.config.values import INT32_MAX

PRECISIONS = {"f32": jnp.float32, "bf16": jnp.bfloat16}
# The exact kinds, and fastgp.approximate_r1 (first-order autodiff only).
TrainKind: TypeAlias = Kind | Literal["approximate-r1"]
# "auto": fastgp.train.run.penalty_tuning picks one of SECOND_ORDER at start-up, before the Trainer.
ConfigSecondOrder: TypeAlias = SecondOrder | Literal["auto"]
Precision: TypeAlias = Literal["f32", "bf16"]
# The critic of an image recipe (fastgp.train.recipes.defaults): the conv network, or the small ViT.
CriticName: TypeAlias = Literal["conv", "vit"]
CRITICS: tuple[CriticName, ...] = ("conv", "vit")
TRAIN_KINDS: tuple[TrainKind, ...] = (*KINDS, "approximate-r1")
CONFIG_SECOND_ORDER: tuple[ConfigSecondOrder, ...] = (*SECOND_ORDER, "auto")
# jax.random.PRNGKey takes a C long; evaluation keys use seed + 10_000.
SEED_RANGE = (-(2**63), 2**63 - 1 - 10_000)

__all__ = [
    "CONFIG_SECOND_ORDER",
    "CRITICS",
    "INT32_MAX",
    "PRECISIONS",
    "SEED_RANGE",
    "TRAIN_KINDS",
    "ConfigSecondOrder",
    "CriticName",
    "Precision",
    "TrainKind",
]
