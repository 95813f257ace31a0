"""Default training recipes per dataset: the config, the networks and the real-data sampler.

    RECIPES[dataset]                      -> Recipe(fields, steps, width)
    default_config(dataset, **overrides)  -> TrainConfig   (the tuned recipe of ``dataset``)
    default_steps(dataset)                -> generator iterations of a default run
    build_problem(dataset, config)        -> Problem(generator, critic, sample_real, image)

The recipes are the values of ``TOY`` (8 Gaussians and the Swiss roll: ``TOY_DEPTH`` x
``width`` ReLU MLPs), ``GRID`` (25 Gaussians: the toy recipe with narrower MLPs, fewer critic
steps and the lazy penalty) and ``DIGITS`` (the conv pair of ``fastgp.train.models`` with
``width`` channels, trained on ``load_digits(split="train")`` and scored by
``fastgp.train.evaluation`` against the other half). How they were chosen and what they
score: docs/trainer.md.
"""

from collections.abc import Callable
from typing import Any, NamedTuple

from fastgp.train.data import TOY_DATASETS, load_digits, sample_toy
from fastgp.train.models import Model, conv_critic, conv_generator, mlp
from fastgp.train.state import TrainConfig, index_sampler

TOY_DEPTH = 3


class Recipe(NamedTuple):
    """A dataset's default run: ``TrainConfig`` fields, generator iterations, and the hidden
    width of both toy MLPs or the channels of the digits conv pair."""

    fields: dict[str, Any]
    steps: int
    width: int


def _recipe(*, steps: int, width: int, lr: float, **fields: Any) -> Recipe:
    """A recipe of ``TrainConfig`` ``fields`` with one Adam learning rate ``lr`` for both networks,
    betas (0.5, 0.9), decaying over the final half of the run."""
    shared = {"lr_g": lr, "lr_d": lr, "betas": (0.5, 0.9), "decay_fraction": 0.5}
    return Recipe({**fields, **shared}, steps, width)


TOY = _recipe(
    steps=6000, width=128, lr=2e-3, batch_size=256, n_critic=5, gp_weight=1.0, latent_dim=2
)
GRID = Recipe(
    {**TOY.fields, "n_critic": 3, "gp_every": 4, "decay_fraction": 0.6}, steps=10000, width=96
)
DIGITS = _recipe(
    steps=9000, width=32, lr=1e-3, batch_size=64, n_critic=3, gp_weight=10.0, latent_dim=32
)
RECIPES = {"8gaussians": TOY, "25gaussians": GRID, "swissroll": TOY, "digits": DIGITS}


class Problem(NamedTuple):
    """What a run trains: a ``fastgp.train.models.Model`` pair, ``sample_real(key, n)``, image
    data?"""

    generator: Model
    critic: Model
    sample_real: Callable[[Any, int], Any]
    image: bool


def _check(dataset: str) -> None:
    if dataset not in RECIPES:
        raise ValueError(f"unknown dataset {dataset!r}; valid names: {', '.join(RECIPES)}")


def default_steps(dataset: str) -> int:
    """Generator iterations of a default run on ``dataset``."""
    _check(dataset)
    return RECIPES[dataset].steps


def default_config(dataset: str, **overrides: Any) -> TrainConfig:
    """The recipe's ``TrainConfig`` for ``dataset``; ``overrides`` replace fields (None: keep).

    ``total_steps`` defaults to :func:`default_steps`.
    """
    _check(dataset)
    fields = dict(RECIPES[dataset].fields, total_steps=default_steps(dataset))
    fields.update({k: v for k, v in overrides.items() if v is not None})
    return TrainConfig(**fields)


def toy_networks(
    latent_dim: int,
    width: int,
    depth: int = TOY_DEPTH,
    activation: str = "relu",
    g_width: int | None = None,
    g_depth: int | None = None,
) -> tuple[Model, Model]:
    """(generator, critic) MLPs for 2-D data: ``depth`` hidden layers of ``width`` units
    (the generator's: ``g_width`` and ``g_depth`` when given)."""
    g_width, g_depth = g_width or width, g_depth or depth
    generator = mlp([latent_dim] + [g_width] * g_depth + [2], activation)
    critic = mlp([2] + [width] * depth + [1], activation)
    return generator, critic


def build_problem(dataset: str, config: TrainConfig) -> Problem:
    """The networks and the jittable real-data sampler of ``dataset`` under ``config``."""
    _check(dataset)
    recipe = RECIPES[dataset]
    if dataset in TOY_DATASETS:
        generator, critic = toy_networks(config.latent_dim, recipe.width)
        return Problem(generator, critic, lambda key, n: sample_toy(dataset, key, n), False)
    return Problem(
        conv_generator(config.latent_dim, recipe.width),
        conv_critic(recipe.width),
        index_sampler(load_digits(split="train")),
        True,
    )


__all__ = [
    "DIGITS",
    "GRID",
    "Problem",
    "RECIPES",
    "Recipe",
    "TOY",
    "build_problem",
    "default_config",
    "default_steps",
    "toy_networks",
]
