"""What both trainers share: the state, initialisation and the RNG derivation.

The sharded trainer (``fastgp.train.trainers.trainer``) and the plain one-device oracle
(``fastgp.train.trainers.naive_trainer``) must see the same parameters, optimiser and random
numbers, so all of that is defined here once, for a ``fastgp.train.config.TrainConfig``:

    TrainState                           (iteration, key, g_params, d_params, g_opt, d_opt)
    init_state(config, generator, critic) -> TrainState
    critic_keys(key, iteration, step)    -> (k_real, k_noise, k_alpha) of one critic step
    generator_key(key, iteration, n_critic) -> noise key of one generator step
    gp_schedule(config, critic_index)    -> (apply penalty?, weight)   lazy regularisation
    optimizers(config)                   -> (generator, critic) Adam, with the optional LR decay
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fastgp.train.config import TrainConfig
from fastgp.train.objective.penalties import lazy_adam, scheduled_weight
from fastgp.train.trainers.averaging import averaged


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
    "TrainState",
    "critic_keys",
    "generator_key",
    "gp_schedule",
    "index_sampler",
    "init_state",
    "lr_schedule",
    "optimizers",
]
