"""Default training recipes per dataset: the config, the networks and the real-data sampler.

    RECIPES[dataset]                      -> Recipe(fields, steps, width, head)
    recipe(dataset, critic="conv", name=None) -> the Recipe of ``dataset`` with that critic, or
                                             the one of NAMED_RECIPES called ``name``
    default_config(dataset, recipe_name=None, **overrides) -> TrainConfig
    default_steps(dataset, critic="conv") -> generator iterations of a default run
    build_problem(dataset, config)        -> Problem(generator, critic, sample_real, image)

The recipes are the values of ``TOY`` (8 Gaussians and the Swiss roll: ``TOY_DEPTH`` x ``width``
ReLU MLPs), ``GRID`` (25 Gaussians: the toy recipe with narrower MLPs, fewer critic steps and the
lazy penalty), ``DIGITS`` (the 8x8 conv pair of ``fastgp.train.models.networks`` with ``width``
channels, trained on ``load_digits(split="train")`` and scored by ``fastgp.train.data.quality``
against the other half) and ``MNIST`` (a conv pair for the 28x28 MNIST digits of ``load_mnist``,
trained with R3GAN's objective). ``critic="vit"`` (``--critic vit``) trains an image dataset's conv
generator against the ViT critic of ``fastgp.train.models.networks`` shaped by
``VIT_SHAPES[dataset]``, with the recipe ``DIGITS_VIT`` or ``MNIST_VIT``. A recipe trained with
another loss, R3GAN's, is taken by its name only (``NAMED_RECIPES``, ``--recipe``): a flag sets its
own field and nothing else, so no loss brings in a recipe's schedule. How the recipes were chosen
and what they score: docs/trainer.md.
"""

from collections.abc import Callable
from typing import Any, NamedTuple

from fastgp.train.config import CRITICS, TrainConfig
from fastgp.train.data.sets import MNIST_SHAPE, TOY_DATASETS, load_digits, load_mnist, sample_toy
from fastgp.train.models.networks import Image, Model, conv_critic, conv_generator, mlp, vit_critic
from fastgp.train.trainers.state import index_sampler

TOY_DEPTH = 3


class Recipe(NamedTuple):
    """A dataset's default run: ``TrainConfig`` fields, generator iterations, the hidden
    width of both toy MLPs or the channels of an image dataset's conv pair, and the channels of
    the conv generator's convs at the image's side (None: ``width``)."""

    fields: dict[str, Any]
    steps: int
    width: int
    head: int | None = None


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
# R3GAN's objective (the relativistic loss, exact R1 + R2 at weight 1 each, one critic step) with
# R3GAN's Adam betas (0, 0.99), batch 32, the generator's parameter average as the samples'
# source, and a generator whose 28x28 convs are narrow (a CPU step's largest cost): sized for a
# run within 10 minutes on 2 CPU cores (docs/trainer.md: how it was chosen, its time and quality).
MNIST = Recipe(
    {
        **{"lr_g": 2e-4, "lr_d": 2e-4, "betas": (0.0, 0.99), "decay_fraction": 0.5},
        **{"batch_size": 32, "n_critic": 1, "latent_dim": 64, "g_average": 250},
        **{"loss": "relativistic", "gp_kind": "r1", "gp_at": "real+fake", "gp_weight": 1.0},
    },
    steps=5000,
    width=32,
    head=16,
)
RECIPES = {
    "8gaussians": TOY,
    "25gaussians": GRID,
    "swissroll": TOY,
    "digits": DIGITS,
    "mnist": MNIST,
}
# An image dataset's loader (``load(split=...)``) and the shape (H, W, C) of one image.
IMAGES = {
    "digits": (load_digits, (8, 8, 1)),
    "mnist": (load_mnist, MNIST_SHAPE),
}


class VitShape(NamedTuple):
    """The ViT critic's shape: ``fastgp.train.models.networks.vit_critic``'s arguments."""

    width: int
    depth: int
    heads: int
    patch: int
    mlp_ratio: int
    image: Image = (8, 8, 1)


# --critic vit on digits: the digits recipe's conv generator (DIGITS.width channels) against the
# ViT critic VIT, with its own learning rate and length (docs/trainer.md: the sweep behind them).
VIT = VitShape(width=64, depth=2, heads=4, patch=4, mlp_ratio=2)
DIGITS_VIT = Recipe(
    {**DIGITS.fields, "lr_g": 1e-3, "lr_d": 1e-3, "critic": "vit"}, steps=3000, width=DIGITS.width
)
# --critic vit on MNIST: 7x7 tokens of 4x4 pixels, the digits ViT's width and depth, trained as
# the conv critic's recipe is, for longer.
MNIST_VIT = MNIST._replace(fields={**MNIST.fields, "critic": "vit"}, steps=4000)
VIT_SHAPES = {"digits": VIT, "mnist": VIT._replace(image=MNIST_SHAPE)}
# (dataset, critic) -> recipe, for the critics other than a recipe's own ("conv").
CRITIC_RECIPES = {("digits", "vit"): DIGITS_VIT, ("mnist", "vit"): MNIST_VIT}


def _r3gan(base: Recipe, steps: int) -> Recipe:
    """``base`` trained as R3GAN is: the relativistic loss, one critic step per generator step,
    exact R1 + R2 at weight 1 (R3GAN's gamma 2) on a cosine schedule to a tenth."""
    fields = {
        **base.fields,
        **{"loss": "relativistic", "n_critic": 1, "gp_kind": "r1", "gp_at": "real+fake"},
        **{"gp_weight": 1.0, "gp_schedule": "cosine", "gp_weight_final": 0.1},
    }
    return base._replace(fields=fields, steps=steps)


# (dataset, critic, name) -> a recipe taken by name (``--recipe``) in place of the dataset's own:
# on MNIST with the ViT critic, R3GAN's (docs/trainer.md: its default run's time and quality).
NAMED_RECIPES = {("mnist", "vit", "r3gan"): _r3gan(MNIST_VIT, steps=MNIST_VIT.steps)}
RECIPE_NAMES = tuple(sorted({name for _, _, name in NAMED_RECIPES}))


class Problem(NamedTuple):
    """What a run trains: a ``fastgp.train.models.networks.Model`` pair, ``sample_real(key, n)``,
    and the shape of one image (H, W, C), or () for the 2-D points of the toy sets (falsy)."""

    generator: Model
    critic: Model
    sample_real: Callable[[Any, int], Any]
    image: tuple[int, ...]


def _check(dataset: str) -> None:
    if dataset not in RECIPES:
        raise ValueError(f"unknown dataset {dataset!r}; valid names: {', '.join(RECIPES)}")


def recipe(dataset: str, critic: str = "conv", name: str | None = None) -> Recipe:
    """The recipe of ``dataset`` with ``critic`` ("conv": the dataset's own networks), or the one
    of :data:`NAMED_RECIPES` called ``name`` for them; ValueError for an unknown name, a critic
    the dataset cannot take (the ViT takes images only) or a name without a recipe there."""
    _check(dataset)
    if critic not in CRITICS:
        raise ValueError(f"unknown critic {critic!r}; valid: {', '.join(CRITICS)}")
    if critic != "conv" and (dataset, critic) not in CRITIC_RECIPES:
        images = sorted({d for d, c in CRITIC_RECIPES if c == critic})
        raise ValueError(
            f"the {critic} critic takes images and {dataset} is 2-D points; use it with "
            f"--dataset {' or '.join(images)}"
        )
    if name is not None:
        return _named(dataset, critic, name)
    return RECIPES[dataset] if critic == "conv" else CRITIC_RECIPES[dataset, critic]


def _named(dataset: str, critic: str, name: str) -> Recipe:
    """The recipe called ``name`` for ``dataset`` and ``critic``; ValueError naming where the
    name has one, when not here."""
    if (dataset, critic, name) in NAMED_RECIPES:
        return NAMED_RECIPES[dataset, critic, name]
    where = [f"--dataset {d} --critic {c}" for d, c, n in NAMED_RECIPES if n == name]
    raise ValueError(
        f"no recipe {name!r} for {dataset} with the {critic} critic"
        + (f"; it is a recipe of {' and of '.join(where)}" if where else "")
        + f"; recipes by name: {', '.join(RECIPE_NAMES)}"
    )


def recipe_hint(dataset: str, critic: str, loss: str) -> str | None:
    """A line for a run that sets ``loss`` on the dataset's own recipe where a named recipe
    trains that loss: that ``--loss`` changes the loss alone, and the recipe's name; else None."""
    own = recipe(dataset, critic).fields.get("loss", "wasserstein")
    names = [n for (d, c, n), r in NAMED_RECIPES.items() if (d, c) == (dataset, critic)]
    named = [n for n in names if NAMED_RECIPES[dataset, critic, n].fields.get("loss") == loss]
    if loss == own or not named:
        return None
    return (
        f"--loss {loss} replaces only the loss of the {dataset} recipe with the {critic} critic "
        f"(tuned for the {own} loss); --recipe {named[0]} trains the whole recipe of that loss"
    )


def default_steps(dataset: str, critic: str = "conv") -> int:
    """Generator iterations of a default run on ``dataset`` with ``critic``."""
    return recipe(dataset, critic).steps


def default_config(dataset: str, recipe_name: str | None = None, **overrides: Any) -> TrainConfig:
    """The ``TrainConfig`` of ``dataset``'s recipe (with the critic ``overrides["critic"]``,
    default "conv"), or of the recipe called ``recipe_name``; ``overrides`` replace fields
    (None: keep), each its own field only.

    ``total_steps`` defaults to the recipe's steps.
    """
    chosen = recipe(dataset, overrides.get("critic") or "conv", recipe_name)
    fields = dict(chosen.fields, total_steps=chosen.steps)
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


def vit_shape(dataset: str, patch: int | None = None) -> VitShape:
    """The ViT critic's shape on ``dataset``, with patch side ``patch`` (None: the recipe's);
    ValueError naming the patch and the image when the patch does not tile the image."""
    shape = VIT_SHAPES[dataset]
    if patch is None:
        return shape
    height, width = shape.image[:2]
    if height % patch or width % patch:
        tokens = (height // shape.patch) * (width // shape.patch)
        raise ValueError(
            f"a ViT patch of {patch} does not tile {dataset}'s {height}x{width} images; take a "
            f"divisor of both, e.g. {shape.patch} ({tokens} tokens)"
        )
    return shape._replace(patch=patch)


def build_problem(dataset: str, config: TrainConfig) -> Problem:
    """The networks and the jittable real-data sampler of ``dataset`` under ``config`` (its
    ``critic``: ValueError for one the dataset cannot take)."""
    chosen = recipe(dataset, config.critic)
    if dataset in TOY_DATASETS:
        generator, critic = toy_networks(config.latent_dim, chosen.width)
        return Problem(generator, critic, lambda key, n: sample_toy(dataset, key, n), ())
    load, image = IMAGES[dataset]
    critic = (
        vit_critic(**vit_shape(dataset, config.vit_patch)._asdict())
        if config.critic == "vit"
        else conv_critic(chosen.width, image=image)
    )
    return Problem(
        conv_generator(config.latent_dim, chosen.width, image=image, head_channels=chosen.head),
        critic,
        index_sampler(load(split="train")),
        image,
    )


__all__ = [
    "CRITIC_RECIPES",
    "DIGITS",
    "DIGITS_VIT",
    "GRID",
    "IMAGES",
    "MNIST",
    "MNIST_VIT",
    "NAMED_RECIPES",
    "Problem",
    "RECIPES",
    "RECIPE_NAMES",
    "Recipe",
    "TOY",
    "VIT",
    "VIT_SHAPES",
    "VitShape",
    "build_problem",
    "default_config",
    "default_steps",
    "recipe",
    "recipe_hint",
    "toy_networks",
    "vit_shape",
]
