"""Default training recipes per dataset: the config, the networks and the real-data sampler.

    default_config(dataset, **overrides)  -> TrainConfig   (the tuned recipe for the toy sets)
    default_steps(dataset)                -> generator iterations of a default run
    build_problem(dataset, config)        -> Problem(generator, critic, sample_real, image)

Toy sets (8gaussians, 25gaussians, swissroll), measured on a 2-core CPU: generator and critic
MLPs 3x128 ReLU, noise dim 2, penalty weight 1, Adam 2e-3 for both with betas (0.5, 0.9), batch
256, 5 critic steps, 6000 generator iterations, both learning rates decaying linearly to 0 over
the last half. Digits (8x8 images): the DCGAN-style conv pair of ``fastgp.train.models`` (32
channels), noise dim 32, penalty weight 10, Adam 5e-4 with betas (0.5, 0.9), batch 64, 3 critic
steps, 4500 generator iterations, linear decay over the last half; trained on the first half of
the digits (``load_digits(split="train")``), scored by ``fastgp.train.digit_quality`` against the
other. Measured on the shared 2-core CPU (runs of 3000-6000 steps, see the README): 5 critic steps
at 3000 iterations reach C2ST 0.62-0.64, 3 at 4500 0.58-0.59, all 10 classes covered.
"""

from typing import Callable, NamedTuple

from fastgp.train.data import DATASETS, TOY_DATASETS, load_digits, sample_toy
from fastgp.train.models import Model, conv_critic, conv_generator, mlp
from fastgp.train.state import TrainConfig, index_sampler

TOY_RECIPE = dict(batch_size=256, n_critic=5, gp_weight=1.0, lr_g=2e-3, lr_d=2e-3,
                  betas=(0.5, 0.9), latent_dim=2, decay_fraction=0.5)
TOY_STEPS = 6000
TOY_WIDTH, TOY_DEPTH = 128, 3

DIGITS_RECIPE = dict(batch_size=64, n_critic=3, gp_weight=10.0, lr_g=5e-4, lr_d=5e-4,
                     betas=(0.5, 0.9), latent_dim=32, decay_fraction=0.5)
DIGITS_STEPS = 4500
DIGITS_CHANNELS = 32


class Problem(NamedTuple):
    """What a run trains: ``fastgp.train.models.Model`` pair, ``sample_real(key, n)``, image data?"""

    generator: Model
    critic: Model
    sample_real: Callable
    image: bool


def _check(dataset):
    if dataset not in DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; valid names: {', '.join(DATASETS)}")


def default_steps(dataset: str) -> int:
    """Generator iterations of a default run on ``dataset``."""
    _check(dataset)
    return TOY_STEPS if dataset in TOY_DATASETS else DIGITS_STEPS


def default_config(dataset: str, **overrides) -> TrainConfig:
    """The recipe's ``TrainConfig`` for ``dataset``; ``overrides`` replace fields (None: keep).

    ``total_steps`` defaults to :func:`default_steps`.
    """
    _check(dataset)
    fields = dict(TOY_RECIPE if dataset in TOY_DATASETS else DIGITS_RECIPE)
    fields["total_steps"] = default_steps(dataset)
    fields.update({k: v for k, v in overrides.items() if v is not None})
    return TrainConfig(**fields)


def toy_networks(latent_dim: int, width: int = TOY_WIDTH, depth: int = TOY_DEPTH,
                 activation: str = "relu", g_width=None, g_depth=None):
    """(generator, critic) MLPs for 2-D data: ``depth`` hidden layers of ``width`` units."""
    g_width, g_depth = g_width or width, g_depth or depth
    generator = mlp([latent_dim] + [g_width] * g_depth + [2], activation)
    critic = mlp([2] + [width] * depth + [1], activation)
    return generator, critic


def build_problem(dataset: str, config: TrainConfig) -> Problem:
    """The networks and the jittable real-data sampler of ``dataset`` under ``config``."""
    _check(dataset)
    if dataset in TOY_DATASETS:
        generator, critic = toy_networks(config.latent_dim)
        return Problem(generator, critic, lambda key, n: sample_toy(dataset, key, n), False)
    return Problem(conv_generator(config.latent_dim, DIGITS_CHANNELS),
                   conv_critic(DIGITS_CHANNELS), index_sampler(load_digits(split="train")),
                   True)


__all__ = ["Problem", "build_problem", "default_config", "default_steps", "toy_networks"]
