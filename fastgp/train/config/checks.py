"""The checks of a ``TrainConfig``, group by group; each raises ``ConfigError`` naming the field(s).

check(config)     every group in turn: counts, choices, numbers, seed, second order, length,
                  the objective (loss, placement, scale, weight schedule, lazy Adam)
"""

import math
from typing import Any

from fastgp.options import BACKENDS
from fastgp.train.config.choices import (
    CONFIG_SECOND_ORDER,
    CRITICS,
    INT32_MAX,
    PRECISIONS,
    SEED_RANGE,
    TRAIN_KINDS,
)
from fastgp.train.objective.losses import LOSSES
from fastgp.train.objective.penalties import APPROXIMATE_SCALES, PLACEMENTS, WEIGHT_SCHEDULES


class ConfigError(ValueError):
    """An invalid TrainConfig; ``fields`` names the offending field(s)."""

    def __init__(self, fields: str | tuple[str, ...], message: str) -> None:
        super().__init__(message)
        self.fields = (fields,) if isinstance(fields, str) else tuple(fields)


def check(config: Any) -> None:
    """Raise ConfigError naming the first invalid field(s), checked group by group."""
    _check_counts(config)
    _check_choices(config)
    _check_numbers(config)
    _check_seed(config)
    _check_second_order(config)
    _check_length(config)
    _check_objective(config)


def _check_counts(config: Any) -> None:
    """batch_size, n_critic, gp_every, latent_dim and a given vit_patch: integers in
    1..INT32_MAX (not bools); g_average in 0..INT32_MAX."""
    for name in ("batch_size", "n_critic", "gp_every", "latent_dim", "vit_patch", "g_average"):
        value, low = getattr(config, name), 0 if name == "g_average" else 1
        if name == "vit_patch" and value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= INT32_MAX:
            kind = "a non-negative" if low == 0 else "a positive"
            raise ConfigError(name, f"{name} must be {kind} integer <= {INT32_MAX}, got {value!r}")


def _check_choices(config: Any) -> None:
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


def _check_numbers(config: Any) -> None:
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


def _check_seed(config: Any) -> None:
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


def _check_second_order(config: Any) -> None:
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


def _check_length(config: Any) -> None:
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


def _check_objective(config: Any) -> None:
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


def _check_weight_schedule(config: Any) -> None:
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


__all__ = ["ConfigError", "check"]
