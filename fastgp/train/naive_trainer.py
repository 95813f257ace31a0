"""The oracle: WGAN-GP training written plainly, on one device, with the whole global batch.

No kernels, no ``shard_map``, no custom VJPs: ``jnp.mean`` losses, a hand-written interpolation
and ``fastgp.naive_gradient_penalty`` (nested ``jax.grad``). Parameters, optimiser and
random numbers come from ``fastgp.train.state`` exactly as in ``fastgp.train.trainer``, so the two
must agree to float32 rounding.

    trainer = NaiveTrainer(config, generator, critic, sample_real)
    state = trainer.init()
    state, metrics = trainer.run(state, iterations)
    critic_grads, generator_grads = trainer.gradients(state)

``metrics`` (I iterations, C = n_critic, B = global batch), numpy:
    critic_loss, penalty, wasserstein   (I, C) float32
    gp_applied                          (I, C) bool
    norms                               (I, C, B) float32 per-sample norms (NaN where skipped)
    generator_loss                      (I,) float32
"""

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fastgp import approximate_r1
from fastgp._penalty.reference import naive_grad_norms, naive_gradient_penalty
from fastgp.train import state as train_state
from fastgp.train.models import Model


class NaiveTrainer:
    """Single-device reference trainer with the same interface and random numbers as
    ``fastgp.train.trainer.Trainer``."""

    def __init__(
        self,
        config: train_state.TrainConfig,
        generator: Model,
        critic: Model,
        sample_real: Callable[..., Any],
    ) -> None:
        self.config = config
        self.generator, self.critic, self.sample_real = generator, critic, sample_real
        self._opt_g, self._opt_d = train_state.optimizers(config)
        self._critic_update = jax.jit(self._critic_update_impl, static_argnums=(2, 3))
        self._generator_update = jax.jit(self._generator_update_impl)
        self._generator_grads = jax.jit(jax.grad(self._generator_loss))

    def init(self) -> train_state.TrainState:
        return train_state.init_state(self.config, self.generator, self.critic)

    def run(
        self, state: train_state.TrainState, iterations: int
    ) -> tuple[train_state.TrainState, dict[str, Any]]:
        """``iterations`` generator iterations, one jitted step at a time; (state, metrics)."""
        cfg = self.config
        records = []
        for _ in range(iterations):
            iteration = int(state.iteration)
            steps = []
            for step in range(cfg.n_critic):
                apply_gp, weight = train_state.gp_schedule(cfg, iteration * cfg.n_critic + step)
                state, metrics, _ = self._critic_update(state, step, bool(apply_gp), weight)
                steps.append(metrics)
            state, generator_loss = self._generator_update(state)
            record = {name: np.stack([np.asarray(m[name]) for m in steps]) for name in steps[0]}
            record["generator_loss"] = np.asarray(generator_loss)
            records.append(record)
        return state, {name: np.stack([r[name] for r in records]) for name in records[0]}

    def gradients(self, state: train_state.TrainState) -> tuple[Any, Any]:
        """(critic grads, generator grads) of the first critic step and of the generator step of
        iteration ``state.iteration``, both at ``state``'s parameters (no update)."""
        apply_gp, weight = train_state.gp_schedule(
            self.config, int(state.iteration) * self.config.n_critic
        )
        _, _, critic_grads = self._critic_update(state, 0, bool(apply_gp), weight)
        return critic_grads, self._generator_grads(
            state.g_params, state.d_params, self._generator_key(state)
        )

    # --- plain jnp -----------------------------------------------------------------------------

    def _scores(self, d_params: Any, x: jax.Array) -> jax.Array:
        out = self.critic.apply(d_params, x, dtype=self.config.dtype)
        return out.astype(jnp.float32).reshape(x.shape[0])

    def _fake(self, g_params: Any, key: jax.Array) -> jax.Array:
        z = jax.random.normal(key, (self.config.batch_size, self.config.latent_dim), jnp.float32)
        return self.generator.apply(g_params, z, dtype=self.config.dtype).astype(jnp.float32)

    def _critic_loss(
        self,
        d_params: Any,
        g_params: Any,
        real: jax.Array,
        keys: jax.Array,
        weight: Any,
        apply_gp: bool,
    ) -> tuple[jax.Array, tuple[Any, Any, Any]]:
        cfg = self.config
        _, k_noise, k_alpha = keys
        fake = self._fake(g_params, k_noise)
        critic = functools.partial(self._scores, d_params)
        wasserstein = jnp.mean(critic(real)) - jnp.mean(critic(fake))
        if not apply_gp:
            return -wasserstein, (wasserstein, jnp.float32(0.0), None)
        if cfg.gp_kind == "approximate-r1":
            points = real.astype(cfg.dtype)
            penalty = approximate_r1(critic, points, k_alpha, sigma=cfg.gp_sigma, weight=weight)
            return penalty - wasserstein, (wasserstein, penalty, None)
        if cfg.gp_kind == "r1":
            points = real
        else:
            alpha = jax.random.uniform(k_alpha, (real.shape[0],), jnp.float32)
            alpha = alpha.reshape((-1,) + (1,) * (real.ndim - 1))
            points = real + alpha * (fake - real)
        points = points.astype(cfg.dtype)  # as in the trainer: input-gradients in the compute dtype
        penalty = naive_gradient_penalty(
            critic, points, kind=cfg.exact_kind, target=cfg.gp_target, weight=weight
        )
        return penalty - wasserstein, (wasserstein, penalty, points)

    def _critic_update_impl(
        self, state: train_state.TrainState, step: int, apply_gp: bool, weight: float
    ) -> tuple[train_state.TrainState, dict[str, Any], Any]:
        cfg = self.config
        keys = train_state.critic_keys(state.key, state.iteration, step)
        real = self.sample_real(keys[0], cfg.batch_size).astype(jnp.float32)
        (loss, (wasserstein, penalty, points)), grads = jax.value_and_grad(
            self._critic_loss, has_aux=True
        )(state.d_params, state.g_params, real, keys, weight, apply_gp)
        if apply_gp and points is not None:
            input_grads = jax.grad(lambda x: jnp.sum(self._scores(state.d_params, x)))(points)
            norms = naive_grad_norms(input_grads)
        else:
            norms = jnp.full((cfg.batch_size,), jnp.nan, jnp.float32)
        updates, d_opt = self._opt_d.update(grads, state.d_opt, state.d_params)
        state = state._replace(d_params=optax.apply_updates(state.d_params, updates), d_opt=d_opt)
        metrics = {
            "critic_loss": loss,
            "penalty": penalty,
            "wasserstein": wasserstein,
            "gp_applied": jnp.asarray(apply_gp),
            "norms": norms,
        }
        return state, metrics, grads

    def _generator_key(self, state: train_state.TrainState) -> jax.Array:
        return train_state.generator_key(state.key, state.iteration, self.config.n_critic)

    def _generator_loss(self, g_params: Any, d_params: Any, key: jax.Array) -> jax.Array:
        return -jnp.mean(self._scores(d_params, self._fake(g_params, key)))

    def _generator_update_impl(
        self, state: train_state.TrainState
    ) -> tuple[train_state.TrainState, jax.Array]:
        loss, grads = jax.value_and_grad(self._generator_loss)(
            state.g_params, state.d_params, self._generator_key(state)
        )
        updates, g_opt = self._opt_g.update(grads, state.g_opt, state.g_params)
        state = state._replace(
            iteration=state.iteration + 1,
            g_params=optax.apply_updates(state.g_params, updates),
            g_opt=g_opt,
        )
        return state, loss


__all__ = ["NaiveTrainer"]
