"""Where the trainer takes its penalty, with what weight at each step, and how lazily.

    PLACEMENTS                                 the points a penalty is taken at (below)
    default_placement(kind)                    "interpolates" for WGAN-GP/LP, else "real"
    scheduled_weight(weight, final, warmup, total, iteration)   the weight at an iteration
    approximate_weight(weight, sigma, scale)   the weight handed to fastgp.approximate_r1
    lazy_adam(lr, betas, every)                StyleGAN2's Adam for a penalty every k steps
    placed_penalty(config, critic, real, fake, key, weight, backend, axis_name)
                                               the trainer's penalty at its placement

Placements: "interpolates" (real + alpha (fake - real), WGAN-GP and LP), "real" (R1), "fake"
(R2), "real+fake" (R1 + R2, each with the full weight: R3GAN's gamma/2 (R1 + R2) is weight
gamma/2). fastgp's R1 is ``weight * mean |grad D|^2``, so StyleGAN's and R3GAN's gamma is twice
the weight.

The approximate penalty (``fastgp.approximate_r1``) is ``lam * mean (D(x + sigma eps) - D(x))^2``,
about R1 with weight lam sigma^2. Its two scalings: "lambda" hands the weight over as lam (APT:
lam = 100, sigma = 0.01, so R1 with weight 0.01); "r1" divides it by sigma^2 first, so the weight
reads as an exact R1 weight (the finite differences of Adversarial Flow Models, over eps^2).
"""

import math
from collections.abc import Callable
from typing import Any, Literal, TypeAlias

import jax
import jax.numpy as jnp

from fastgp import approximate_r1
from fastgp.penalty import gradient_penalty_and_norms, interpolate

Placement: TypeAlias = Literal["interpolates", "real", "fake", "real+fake"]
PLACEMENTS: tuple[Placement, ...] = ("interpolates", "real", "fake", "real+fake")
ApproximateScale: TypeAlias = Literal["lambda", "r1"]
APPROXIMATE_SCALES: tuple[ApproximateScale, ...] = ("lambda", "r1")
WeightSchedule: TypeAlias = Literal["constant", "cosine"]
WEIGHT_SCHEDULES: tuple[WeightSchedule, ...] = ("constant", "cosine")


def default_placement(kind: str) -> Placement:
    """Where each kind is taken by default: WGAN-GP and LP at the interpolates, R1 (exact or
    approximate) at the reals."""
    return "interpolates" if kind in ("wgan-gp", "wgan-lp") else "real"


def placement_parts(placement: Placement) -> tuple[str, ...]:
    """The point sets of a placement: ("real", "fake") for "real+fake", else the one."""
    return ("real", "fake") if placement == "real+fake" else (placement,)


def scheduled_weight(
    weight: float, final: float | None, warmup: int, total: int | None, iteration: Any
) -> Any:
    """The penalty weight at generator iteration ``iteration`` (may be traced).

    ``final`` None: ``weight`` throughout. Otherwise a cosine schedule with warm-up (R3GAN's): a
    linear ramp from 0 to ``weight`` over the first ``warmup`` iterations, then a half cosine
    from ``weight`` to ``final`` over the rest of the ``total`` iterations, then ``final``."""
    if final is None:
        return weight
    if total is None:
        raise ValueError("a cosine weight schedule needs the run's total iterations")
    t = jnp.asarray(iteration, jnp.float32)
    ramp = weight * t / max(warmup, 1)
    progress = jnp.clip((t - warmup) / max(total - warmup, 1), 0.0, 1.0)
    cosine = final + (weight - final) * 0.5 * (1.0 + jnp.cos(math.pi * progress))
    return jnp.where(t < warmup, ramp, cosine)


def approximate_weight(weight: Any, sigma: float, scale: ApproximateScale) -> Any:
    """λ for ``fastgp.approximate_r1``: ``weight`` ("lambda") or ``weight / sigma**2`` ("r1")."""
    return weight if scale == "lambda" else weight / sigma**2


def lazy_adam(
    lr: float, betas: tuple[float, float], every: int
) -> tuple[float, tuple[float, float]]:
    """StyleGAN2's correction of Adam for a penalty applied every ``every`` steps (its
    ``mb_ratio = k / (k + 1)``): the learning rate times the ratio, each beta to its power."""
    ratio = every / (every + 1)
    return lr * ratio, (betas[0] ** ratio, betas[1] ** ratio)


def placed_penalty(
    config: Any,
    critic: Callable[[jax.Array], jax.Array],
    real: jax.Array,
    fake: jax.Array,
    key: jax.Array,
    weight: Any,
    backend: Any,
    axis_name: str,
) -> tuple[jax.Array, jax.Array | None]:
    """(penalty, (P * B_local,) input-gradient norms or None) of a ``TrainConfig``'s kind at its
    placement, inside ``shard_map`` over the batch axis ``axis_name``: each of the placement's
    point sets with the full ``weight`` (R1 + R2 at "real+fake"), their norms concatenated; the
    interpolates' alpha from ``key``; the approximate kind's noise from ``key`` folded with the
    set's index, and no norms (it takes no input-gradient)."""
    sets = {"real": real, "fake": fake}
    if config.placement == "interpolates":
        sets["interpolates"] = interpolate(key, real, fake, axis_name=axis_name)
    penalties, norms = [], []
    for index, part in enumerate(placement_parts(config.placement)):
        # In the compute dtype: the input-gradients, the penalty's operand, are then bf16 under
        # bf16 and reach the kernel as such (float32 sums inside it).
        points = sets[part].astype(config.dtype)
        if config.gp_kind == "approximate-r1":
            lam = approximate_weight(weight, config.gp_sigma, config.approx_scale)
            noise_key = jax.random.fold_in(key, index)
            penalties.append(
                approximate_r1(
                    critic,
                    points,
                    noise_key,
                    sigma=config.gp_sigma,
                    weight=lam,
                    axis_name=axis_name,
                )
            )
            continue
        penalty, part_norms = gradient_penalty_and_norms(
            critic,
            points,
            kind=config.exact_kind,
            target=config.gp_target,
            weight=weight,
            backend=backend,
            axis_name=axis_name,
            second_order=config.resolved_second_order,
        )
        penalties.append(penalty)
        norms.append(part_norms)
    total = sum(penalties[1:], penalties[0])
    return total, (jnp.concatenate(norms) if norms else None)


__all__ = [
    "APPROXIMATE_SCALES",
    "PLACEMENTS",
    "WEIGHT_SCHEDULES",
    "ApproximateScale",
    "Placement",
    "WeightSchedule",
    "approximate_weight",
    "default_placement",
    "lazy_adam",
    "placed_penalty",
    "placement_parts",
    "scheduled_weight",
]
