"""``--second-order auto``: the trainer's own critic loss handed to ``fastgp.autotune`` once.

    config, tuning = choose_second_order(config, problem, local_batch)
    tuning_line(config, tuning)   -> the line the run prints;  tuning_record(tuning) -> run.json's

The loss is the trainer's critic loss on one device at the per-device batch: W = mean D(real) -
mean D(fake) and the penalty at interpolates (at the reals for R1), in the run's compute dtype,
with the run's kind, target, weight and backend. Both second orders are checked against the naive
penalty (value and critic-parameter gradients: 1e-5 in float32, 2e-2 in bfloat16) and timed; the
faster exact one replaces ``"auto"`` in the returned config, which is what the checkpoints record,
so a resumed run keeps it. In a multi-process run process 0's pick is broadcast to every process:
all compile the same program.
"""

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fastgp.autotune import Tuning, Variant, autotune
from fastgp.penalty import SECOND_ORDER, interpolate
from fastgp.train.config import TrainConfig
from fastgp.train.recipes.defaults import Problem

BF16_RTOL = 2e-2  # a bfloat16 critic's two second orders round differently


def _critic_loss(config: TrainConfig, problem: Problem, g_params: Any) -> Any:
    """The trainer's critic loss on one device, the generator's parameters held fixed."""

    def critic_loss(
        d_params: Any, real: jax.Array, z: jax.Array, key: jax.Array, *, penalty: Any
    ) -> jax.Array:
        fake = problem.generator.apply(g_params, z, dtype=config.dtype)
        fake = fake.astype(jnp.float32)

        def critic(x: jax.Array) -> jax.Array:
            out = problem.critic.apply(d_params, x, dtype=config.dtype)
            return out.astype(jnp.float32).reshape(x.shape[0])

        wasserstein = jnp.mean(critic(real) - critic(fake))
        points = real if config.gp_kind == "r1" else interpolate(key, real, fake)
        gp = penalty(
            critic,
            points.astype(config.dtype),
            kind=config.gp_kind,
            target=config.gp_target,
            weight=config.gp_weight,
        )
        return gp - wasserstein

    return critic_loss


def _arguments(config: TrainConfig, problem: Problem, batch: int) -> tuple[Any, ...]:
    k_d, k_g, k_real, k_z, k_alpha = jax.random.split(jax.random.PRNGKey(config.seed), 5)
    d_params = problem.critic.init(k_d)
    real = problem.sample_real(k_real, batch).astype(jnp.float32)
    z = jax.random.normal(k_z, (batch, config.latent_dim), jnp.float32)
    return d_params, problem.generator.init(k_g), real, z, k_alpha


def choose_second_order(
    config: TrainConfig, problem: Problem, local_batch: int, *, rounds: int = 5
) -> tuple[TrainConfig, Tuning]:
    """``config`` with ``second_order`` the faster exact one for this run, and the measurements."""
    d_params, g_params, real, z, key = _arguments(config, problem, local_batch)
    backend = "xla" if config.backend == "auto" else config.backend
    tuning = autotune(
        _critic_loss(config, problem, g_params),
        d_params,
        real,
        z,
        key,
        variants=[Variant(order, None, backend) for order in SECOND_ORDER],
        rounds=rounds,
        rtol=BF16_RTOL if jnp.dtype(config.dtype) == jnp.bfloat16 else 1e-5,
    )
    pick = SECOND_ORDER.index(tuning.best["second_order"])
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        pick = int(multihost_utils.broadcast_one_to_all(np.int32(pick)))
    return dataclasses.replace(config, second_order=SECOND_ORDER[pick]), tuning


def tuning_line(config: TrainConfig, tuning: Tuning) -> str:
    """One line on what ``--second-order auto`` measured and chose."""
    times = ", ".join(
        f"{variant.second_order} {seconds * 1e3:.3g} ms"
        for variant, seconds in _per_variant(tuning, "seconds")
        if seconds
    )
    return (
        f"--second-order auto: {config.second_order} (critic step on one device: {times}; "
        f"each checked against the naive penalty)"
    )


def tuning_record(tuning: Tuning) -> dict[str, Any]:
    """What run.json records of the pick (``second_order_tuning``)."""
    return {
        "measured_on": tuning.measured_on,
        "seconds": {v.second_order: s for v, s in _per_variant(tuning, "seconds")},
        "naive_seconds": tuning.naive.seconds,
        "gradient_error": {v.second_order: e for v, e in _per_variant(tuning, "gradient_error")},
    }


def _per_variant(tuning: Tuning, field: str) -> list[tuple[Variant, Any]]:
    """(variant, that result's ``field``) for each variant tuned (the naive yardstick aside)."""
    return [(r.variant, getattr(r, field)) for r in tuning.results if r.variant is not None]


__all__ = ["BF16_RTOL", "choose_second_order", "tuning_line", "tuning_record"]
