"""What both trainers share: the configuration, the state, initialisation and the RNG derivation.

The sharded trainer (``fastgp.train.training.trainer``) and the plain one-device oracle
(``fastgp.train.training.naive_trainer``) must see the same parameters, optimiser and random
numbers, so all of that is defined here once:

    TrainConfig                          hyperparameters (frozen; ``dataclasses.asdict`` for logs)
    TrainState                           (iteration, key, g_params, d_params, g_opt, d_opt)
    init_state(config, generator, critic) -> TrainState
    critic_keys(key, iteration, step)    -> (k_real, k_noise, k_alpha) of one critic step
    generator_key(key, iteration, n_critic) -> noise key of one generator step
    gp_schedule(config, critic_index)    -> (apply penalty?, weight)   lazy regularisation
    optimizers(config)                   -> (generator, critic) Adam, with the optional LR decay
"""

import dataclasses
import math
from collections.abc import Callable
from typing import Any, Literal, NamedTuple, TypeAlias

import jax
import jax.numpy as jnp
import optax

from fastgp._backends import BACKENDS
from fastgp._penalty.kinds import KINDS
from fastgp._typing import Backend, Kind, SecondOrder
from fastgp.penalty import SECOND_ORDER
from fastgp.train.objective.losses import LOSSES, Loss
from fastgp.train.objective.penalties import (
    APPROXIMATE_SCALES,
    PLACEMENTS,
    WEIGHT_SCHEDULES,
    ApproximateScale,
    Placement,
    WeightSchedule,
    default_placement,
    lazy_adam,
    scheduled_weight,
)
from fastgp.train.training.averaging import averaged

PRECISIONS = {"f32": jnp.float32, "bf16": jnp.bfloat16}
# "auto": fastgp.train.run.penalty_tuning picks one of SECOND_ORDER at start-up, before the Trainer.
# The exact kinds, and fastgp.approximate_r1 at the reals (first-order autodiff only).
TrainKind: TypeAlias = Kind | Literal["approximate-r1"]
ConfigSecondOrder: TypeAlias = SecondOrder | Literal["auto"]
Precision: TypeAlias = Literal["f32", "bf16"]
# The critic of an image recipe (fastgp.train.recipes.defaults): the conv network, or the small ViT.
CriticName: TypeAlias = Literal["conv", "vit"]
CRITICS: tuple[CriticName, ...] = ("conv", "vit")
TRAIN_KINDS: tuple[TrainKind, ...] = (*KINDS, "approximate-r1")
CONFIG_SECOND_ORDER: tuple[ConfigSecondOrder, ...] = (*SECOND_ORDER, "auto")
INT32_MAX = 2**31 - 1  # iteration and optimiser step counters are int32
# jax.random.PRNGKey takes a C long; evaluation keys use seed + 10_000.
SEED_RANGE = (-(2**63), 2**63 - 1 - 10_000)


class ConfigError(ValueError):
    """An invalid TrainConfig; ``fields`` names the offending field(s)."""

    def __init__(self, fields: str | tuple[str, ...], message: str) -> None:
        super().__init__(message)
        self.fields = (fields,) if isinstance(fields, str) else tuple(fields)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """GAN training hyperparameters. ``batch_size`` is the GLOBAL batch (all devices).

    One generator iteration is ``n_critic`` critic steps then one generator step. ``loss`` is
    the GAN loss (``fastgp.train.objective.losses``). The penalty ``gp_kind`` is taken at ``gp_at``
    (``fastgp.train.objective.penalties``; None: the kind's usual points) and applied on every
    ``gp_every``-th critic step (counted over the whole run) with weight ``gp_weight * gp_every``
    (lazy regularisation, StyleGAN2), the critic's Adam corrected as StyleGAN2's when
    ``lazy_adam``. ``gp_schedule="cosine"`` moves the weight from ``gp_weight`` to
    ``gp_weight_final`` over ``total_steps`` after ``gp_warmup`` iterations of linear warm-up.
    ``approx_scale`` says how ``gp_weight`` reaches ``approximate-r1``: as its lambda, or ("r1")
    divided by ``gp_sigma**2`` so that it reads as an exact R1 weight. ``precision`` is the
    compute dtype of both networks' ``apply``; parameters, optimiser state, losses and norms
    stay float32. ``vit_patch`` (None: the recipe's) is the ViT critic's patch side.
    ``g_average`` > 0 keeps an exponential moving average of the generator's parameters with
    that half-life in generator steps (``fastgp.train.training.averaging``), and samples and
    evaluations come from it; 0 keeps none. With
    ``decay_fraction > 0`` both learning rates stay constant, then decay
    linearly to 0 over the last ``decay_fraction`` of ``total_steps`` generator iterations (the
    critic's schedule counts its ``n_critic`` steps per iteration).
    ``second_order="auto"`` must be resolved (``fastgp.train.run.penalty_tuning``) before training.
    ``gp_kind="approximate-r1"`` is ``fastgp.approximate_r1`` at ``gp_at`` with noise
    ``gp_sigma``; it takes no input-gradient, so its norm statistics are NaN, and
    ``second_order`` does not apply to it.
    """

    batch_size: int = 64
    n_critic: int = 5
    gp_kind: TrainKind = "wgan-gp"
    gp_target: float = 1.0
    gp_weight: float = 10.0
    gp_every: int = 1
    gp_sigma: float = 0.01
    lr_g: float = 1e-4
    lr_d: float = 1e-4
    betas: tuple[float, float] = (0.5, 0.9)
    precision: Precision = "f32"
    backend: Backend = "auto"
    latent_dim: int = 2
    seed: int = 0
    total_steps: int | None = None
    decay_fraction: float = 0.0
    second_order: ConfigSecondOrder = "reverse-over-forward"
    critic: CriticName = "conv"
    loss: Loss = "wasserstein"
    gp_at: Placement | None = None
    approx_scale: ApproximateScale = "lambda"
    gp_schedule: WeightSchedule = "constant"
    gp_weight_final: float | None = None
    gp_warmup: int = 0
    lazy_adam: bool = False
    vit_patch: int | None = None
    g_average: int = 0

    def __post_init__(self) -> None:
        """Raise ConfigError naming the first invalid field(s), checked group by group."""
        _check_counts(self)
        _check_choices(self)
        _check_numbers(self)
        _check_seed(self)
        _check_second_order(self)
        _check_length(self)
        _check_objective(self)

    @property
    def placement(self) -> Placement:
        """Where the penalty is taken: ``gp_at``, or the kind's default points."""
        return default_placement(self.gp_kind) if self.gp_at is None else self.gp_at

    @property
    def dtype(self) -> Any:
        """The compute dtype passed to ``apply`` (jnp.float32 or jnp.bfloat16)."""
        return PRECISIONS[self.precision]

    @property
    def exact_kind(self) -> Kind:
        """``gp_kind`` as the exact penalty's kind (``"approximate-r1"`` has none)."""
        if self.gp_kind == "approximate-r1":
            raise ValueError("gp_kind='approximate-r1' is not an exact penalty's kind")
        return self.gp_kind

    @property
    def resolved_second_order(self) -> SecondOrder:
        """``second_order`` once ``"auto"`` is resolved (``fastgp.train.run.penalty_tuning``)."""
        if self.second_order == "auto":
            raise ValueError("second_order='auto' is resolved before training")
        return self.second_order


def _check_counts(config: TrainConfig) -> None:
    """batch_size, n_critic, gp_every, latent_dim and a given vit_patch: integers in
    1..INT32_MAX (not bools); g_average in 0..INT32_MAX."""
    for name in ("batch_size", "n_critic", "gp_every", "latent_dim", "vit_patch", "g_average"):
        value, low = getattr(config, name), 0 if name == "g_average" else 1
        if name == "vit_patch" and value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= INT32_MAX:
            kind = "a non-negative" if low == 0 else "a positive"
            raise ConfigError(name, f"{name} must be {kind} integer <= {INT32_MAX}, got {value!r}")


def _check_choices(config: TrainConfig) -> None:
    """gp_kind, precision, backend and critic: one of their known names."""
    if config.gp_kind not in TRAIN_KINDS:
        raise ConfigError(
            "gp_kind", f"unknown gp_kind {config.gp_kind!r}; expected one of {TRAIN_KINDS}"
        )
    if config.precision not in PRECISIONS:
        raise ConfigError(
            "precision",
            f"unknown precision {config.precision!r}; expected one of {tuple(PRECISIONS)}",
        )
    if config.backend not in BACKENDS:
        raise ConfigError(
            "backend", f"unknown backend {config.backend!r}; expected one of {BACKENDS}"
        )
    if config.critic not in CRITICS:
        raise ConfigError("critic", f"unknown critic {config.critic!r}; expected one of {CRITICS}")


def _check_numbers(config: TrainConfig) -> None:
    """gp_target, gp_sigma and the learning rates finite and > 0; gp_weight finite and >= 0;
    betas two numbers in [0, 1)."""
    for name in ("gp_target", "gp_sigma", "lr_g", "lr_d"):
        value = getattr(config, name)
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ConfigError(name, f"{name} must be a finite positive number, got {value!r}")
    if not (
        isinstance(config.gp_weight, (int, float))
        and math.isfinite(config.gp_weight)
        and config.gp_weight >= 0
    ):
        raise ConfigError(
            "gp_weight", f"gp_weight must be a finite number >= 0, got {config.gp_weight!r}"
        )
    if len(config.betas) != 2 or not all(0 <= b < 1 for b in config.betas):
        raise ConfigError("betas", f"betas must be two numbers in [0, 1), got {config.betas!r}")


def _check_seed(config: TrainConfig) -> None:
    """seed: an integer (not a bool) in SEED_RANGE."""
    if (
        not isinstance(config.seed, int)
        or isinstance(config.seed, bool)
        or not SEED_RANGE[0] <= config.seed <= SEED_RANGE[1]
    ):
        raise ConfigError(
            "seed",
            f"seed must be an integer in [{SEED_RANGE[0]}, {SEED_RANGE[1]}], got {config.seed!r}",
        )


def _check_second_order(config: TrainConfig) -> None:
    """second_order: one of CONFIG_SECOND_ORDER, and not "auto" with gp_kind approximate-r1."""
    if config.second_order not in CONFIG_SECOND_ORDER:
        raise ConfigError(
            "second_order",
            f"unknown second_order {config.second_order!r}; expected one of {CONFIG_SECOND_ORDER}",
        )
    if config.gp_kind == "approximate-r1" and config.second_order == "auto":
        raise ConfigError(
            ("gp_kind", "second_order"),
            "second_order='auto' times the exact penalty's second orders; "
            "gp_kind='approximate-r1' takes first-order autodiff only",
        )


def _check_length(config: TrainConfig) -> None:
    """decay_fraction in [0, 1]; total_steps None or a positive integer whose critic steps fit
    the int32 counters; a decay needs total_steps."""
    if not (isinstance(config.decay_fraction, (int, float)) and 0 <= config.decay_fraction <= 1):
        raise ConfigError(
            "decay_fraction",
            f"decay_fraction must be a number in [0, 1], got {config.decay_fraction!r}",
        )
    steps = config.total_steps
    if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps < 1):
        raise ConfigError(
            "total_steps", f"total_steps must be a positive integer or None, got {steps!r}"
        )
    if steps is not None and steps * config.n_critic > INT32_MAX:
        raise ConfigError(
            ("total_steps", "n_critic"),
            (
                f"total_steps x n_critic = {steps} x {config.n_critic} = "
                f"{steps * config.n_critic} critic steps; the step counters are int32, so at "
                f"most {INT32_MAX}"
            ),
        )
    if config.decay_fraction > 0 and steps is None:
        raise ConfigError(
            "decay_fraction",
            "decay_fraction > 0 needs total_steps (the run's "
            "generator iterations) to place the decay",
        )


def _check_objective(config: TrainConfig) -> None:
    """loss, gp_at, approx_scale and the weight schedule: known names and consistent values."""
    for name, valid in (
        ("loss", LOSSES),
        ("gp_at", (None, *PLACEMENTS)),
        ("approx_scale", APPROXIMATE_SCALES),
        ("gp_schedule", WEIGHT_SCHEDULES),
    ):
        if getattr(config, name) not in valid:
            raise ConfigError(
                name, f"unknown {name} {getattr(config, name)!r}; expected one of {valid}"
            )
    if config.gp_kind == "approximate-r1" and config.placement == "interpolates":
        raise ConfigError(
            ("gp_kind", "gp_at"),
            "approximate-r1 estimates R1's squared norm, not WGAN-GP's distance of the norm to "
            "its target: take it at real, fake or real+fake",
        )
    _check_weight_schedule(config)
    if config.lazy_adam and config.gp_every == 1:
        raise ConfigError(
            ("lazy_adam", "gp_every"),
            "lazy_adam corrects Adam for a penalty applied every k > 1 critic steps; "
            "set gp_every > 1",
        )


def _check_weight_schedule(config: TrainConfig) -> None:
    """A cosine schedule needs gp_weight_final (finite, >= 0) and total_steps; gp_warmup is a
    count below total_steps; a constant schedule takes no final weight."""
    final, warmup = config.gp_weight_final, config.gp_warmup
    if config.gp_schedule == "constant":
        if final is not None:
            raise ConfigError(
                ("gp_weight_final", "gp_schedule"),
                "gp_weight_final is the end of a weight schedule: set gp_schedule='cosine'",
            )
        return
    if final is None or not (isinstance(final, (int, float)) and math.isfinite(final)) or final < 0:
        raise ConfigError(
            "gp_weight_final",
            f"a cosine weight schedule needs gp_weight_final, a finite number >= 0, got {final!r}",
        )
    if config.total_steps is None:
        raise ConfigError("total_steps", "a cosine weight schedule needs total_steps")
    if (
        not isinstance(warmup, int)
        or isinstance(warmup, bool)
        or not 0 <= warmup < config.total_steps
    ):
        raise ConfigError(
            "gp_warmup",
            f"gp_warmup must be an integer in [0, total_steps = {config.total_steps}), "
            f"got {warmup!r}",
        )


class TrainState(NamedTuple):
    """Everything a run needs to continue; checkpoint it whole (a pytree of arrays).

    iteration: int32 scalar, generator iterations done. key: uint32 (2,) raw base key.
    g_params/d_params: float32 pytrees. g_opt/d_opt: optax Adam states (float32).
    """

    iteration: jax.Array
    key: jax.Array
    g_params: Any
    d_params: Any
    g_opt: Any
    d_opt: Any


def lr_schedule(lr: float, total: int | None, decay_fraction: float) -> Any:
    """Constant ``lr``; with ``decay_fraction > 0``, linear decay to 0 over the last
    ``decay_fraction`` of ``total`` optimiser steps (then 0)."""
    if decay_fraction <= 0:
        return lr
    if total is None:
        raise ValueError("a decaying learning rate needs the total number of steps")
    start = int(total * (1.0 - decay_fraction))
    return optax.join_schedules(
        [optax.constant_schedule(lr), optax.linear_schedule(lr, 0.0, max(total - start, 1))],
        [start],
    )


def optimizers(config: TrainConfig) -> tuple[Any, Any]:
    """(generator, critic) optax Adam transformations (schedules per ``TrainConfig``; the
    critic's corrected by ``penalties.lazy_adam`` when ``config.lazy_adam``; the generator's
    followed by its parameter average when ``config.g_average``)."""
    total, frac = config.total_steps, config.decay_fraction
    critic_total = None if total is None else total * config.n_critic
    lr_d, betas_d = config.lr_d, config.betas
    if config.lazy_adam:
        lr_d, betas_d = lazy_adam(lr_d, betas_d, config.gp_every)
    generator = optax.adam(lr_schedule(config.lr_g, total, frac), *config.betas)
    if config.g_average:
        generator = averaged(generator, config.g_average)
    return generator, optax.adam(lr_schedule(lr_d, critic_total, frac), *betas_d)


def init_state(config: TrainConfig, generator: Any, critic: Any) -> TrainState:
    """Parameters from ``config.seed`` (float32), fresh Adam states, iteration 0."""
    k_g, k_d, k_run = jax.random.split(jax.random.PRNGKey(config.seed), 3)
    g_params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), generator.init(k_g))
    d_params = jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), critic.init(k_d))
    opt_g, opt_d = optimizers(config)
    return TrainState(
        jnp.int32(0), k_run, g_params, d_params, opt_g.init(g_params), opt_d.init(d_params)
    )


def critic_keys(key: jax.Array, iteration: Any, step: Any) -> tuple[jax.Array, ...]:
    """(k_real, k_noise, k_alpha) for critic step ``step`` of generator iteration ``iteration``."""
    k = jax.random.fold_in(jax.random.fold_in(key, iteration), step)
    return tuple(jax.random.split(k, 3))


def generator_key(key: jax.Array, iteration: Any, n_critic: int) -> jax.Array:
    """Noise key of the generator step of ``iteration`` (index ``n_critic`` after the critic's)."""
    return jax.random.fold_in(jax.random.fold_in(key, iteration), n_critic)


def gp_schedule(config: TrainConfig, critic_index: Any) -> tuple[Any, float]:
    """(apply?, weight) for the critic step with run-wide index ``critic_index``.

    Every step when ``gp_every == 1`` (then ``apply`` is the Python ``True``); otherwise a bool
    (traced if ``critic_index`` is) that is true on multiples of ``gp_every``, weight scaled by k.
    The weight follows ``config.gp_schedule`` over generator iterations (a Python float when
    constant, else an array, traced with ``critic_index``).
    """
    weight = config.gp_weight
    if config.gp_schedule == "cosine":
        weight = scheduled_weight(
            config.gp_weight,
            config.gp_weight_final,
            config.gp_warmup,
            config.total_steps,
            critic_index // config.n_critic,
        )
    if config.gp_every == 1:
        return True, weight
    return critic_index % config.gp_every == 0, weight * config.gp_every


def index_sampler(data: Any) -> Callable[[jax.Array, int], jax.Array]:
    """``sample_real(key, n)``: ``n`` rows of ``data`` (N, ...) drawn uniformly with replacement."""
    data = jnp.asarray(data)

    def sample_real(key: jax.Array, n: int) -> jax.Array:
        return data[jax.random.randint(key, (n,), 0, data.shape[0])]

    return sample_real


__all__ = [
    "CONFIG_SECOND_ORDER",
    "CRITICS",
    "INT32_MAX",
    "PRECISIONS",
    "SEED_RANGE",
    "TRAIN_KINDS",
    "ConfigError",
    "TrainConfig",
    "TrainState",
    "critic_keys",
    "generator_key",
    "gp_schedule",
    "index_sampler",
    "init_state",
    "lr_schedule",
    "optimizers",
]
