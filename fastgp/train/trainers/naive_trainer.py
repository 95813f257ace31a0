"""The oracle: GAN training written plainly, on one device, with the whole global batch.

No kernels, no ``shard_map``, no custom VJPs: ``jnp.mean`` losses, a hand-written interpolation and
``fastgp.naive_gradient_penalty`` (nested ``jax.grad``). Parameters, optimiser and random numbers
come from ``fastgp.train.trainers.state`` exactly as in ``fastgp.train.trainers.trainer``, so the
two must agree to float32 rounding.

    trainer = NaiveTrainer(config, generator, critic, sample_real)
    state = trainer.init()
    state, metrics = trainer.run(state, iterations)
    state, metrics, grads = trainer.critic_update(state, step)   # critic step ``step``
    state, loss, grads = trainer.generator_update(state)         # ends the iteration

``metrics`` (I iterations, C = n_critic, B = global batch), numpy:
    critic_loss, penalty, wasserstein   (I, C) float32
    gp_applied                          (I, C) bool
    norms                               (I, C, B * P) float32 per-sample norms at each of the
                                        P point sets of the placement (NaN where skipped)
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

# Private on purpose: the oracle's per-sample norms in plain jnp; fastgp.grad_norms would route
# them through the backends this oracle checks.
from fastgp._penalty.reference import naive_grad_norms, naive_gradient_penalty
from fastgp.train.config import TrainConfig
from fastgp.train.models.networks import Model
from fastgp.train.trainers import state as train_state


class NaiveTrainer:
    """Single-device reference trainer with the same interface and random numbers as
    ``fastgp.train.trainers.trainer.Trainer``."""

    def __init__(
        self,
        config: TrainConfig,
        generator: Model,
        critic: Model,
        sample_real: Callable[..., Any],
    ) -> None:
        self.config = config
        self.generator, self.critic, self.sample_real = generator, critic, sample_real
        self._opt_g, self._opt_d = train_state.optimizers(config)
        self._critic_update = jax.jit(self._critic_update_impl, static_argnums=2)
        self._generator_update = jax.jit(self._generator_update_impl)

    def init(self) -> train_state.TrainState:
        return train_state.init_state(self.config, self.generator, self.critic)

    def run(
        self, state: train_state.TrainState, iterations: int
    ) -> tuple[train_state.TrainState, dict[str, Any]]:
        """``iterations`` generator iterations, one jitted step at a time; (state, metrics)."""
        records = []
        for _ in range(iterations):
            steps = []
            for step in range(self.config.n_critic):
                state, metrics, _ = self.critic_update(state, step)
                steps.append(metrics)
            state, generator_loss, _ = self.generator_update(state)
            record = {name: np.stack([np.asarray(m[name]) for m in steps]) for name in steps[0]}
            record["generator_loss"] = np.asarray(generator_loss)
            records.append(record)
        return state, {name: np.stack([r[name] for r in records]) for name in records[0]}

    def critic_update(
        self, state: train_state.TrainState, step: int
    ) -> tuple[train_state.TrainState, dict[str, Any], Any]:
        """Critic step ``step`` of iteration ``state.iteration``: (state after it, its metrics,
        its gradients at ``state``'s parameters)."""
        cfg = self.config
        apply_gp, weight = train_state.gp_schedule(cfg, int(state.iteration) * cfg.n_critic + step)
        return self._critic_update(state, step, bool(apply_gp), weight)

    def generator_update(
        self, state: train_state.TrainState
    ) -> tuple[train_state.TrainState, jax.Array, Any]:
        """The generator step that ends iteration ``state.iteration``: (state after it, its loss,
        its gradients at ``state``'s parameters)."""
        return self._generator_update(state)

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
    ) -> tuple[jax.Array, tuple[Any, Any, list[jax.Array]]]:
        cfg = self.config
        _, k_noise, k_penalty = keys
        fake = self._fake(g_params, k_noise)
        critic = functools.partial(self._scores, d_params)
        r, f = critic(real), critic(fake)
        gap = jnp.mean(r) - jnp.mean(f)
        if cfg.loss == "wasserstein":
            loss = jnp.mean(f) - jnp.mean(r)
        elif cfg.loss == "non-saturating":
            loss = jnp.mean(jax.nn.softplus(f)) + jnp.mean(jax.nn.softplus(-r))
        else:  # relativistic: real and fake sample b paired
            loss = jnp.mean(jax.nn.softplus(f - r))
        if not apply_gp:
            return loss, (gap, jnp.float32(0.0), [])
        point_sets = self._penalty_points(real, fake, k_penalty)
        if cfg.gp_kind == "approximate-r1":
            lam = weight / cfg.gp_sigma**2 if cfg.approx_scale == "r1" else weight
            penalty = sum(
                approximate_r1(
                    critic, points, jax.random.fold_in(k_penalty, i), sigma=cfg.gp_sigma, weight=lam
                )
                for i, points in enumerate(point_sets)
            )
            return loss + penalty, (gap, penalty, [])
        penalty = sum(
            naive_gradient_penalty(
                critic, points, kind=cfg.exact_kind, target=cfg.gp_target, weight=weight
            )
            for points in point_sets
        )
        return loss + penalty, (gap, penalty, point_sets)

    def _penalty_points(self, real: jax.Array, fake: jax.Array, key: jax.Array) -> list[Any]:
        """The point sets the penalty is taken at, in the compute dtype (as in the trainer: the
        input-gradients in the compute dtype): R1 + R2 at "real+fake" is two sets."""
        at = self.config.placement
        if at == "interpolates":
            alpha = jax.random.uniform(key, (real.shape[0],), jnp.float32)
            alpha = alpha.reshape((-1,) + (1,) * (real.ndim - 1))
            sets = [real + alpha * (fake - real)]
        else:
            sets = {"real": [real], "fake": [fake], "real+fake": [real, fake]}[at]
        return [points.astype(self.config.dtype) for points in sets]

    def _critic_update_impl(
        self, state: train_state.TrainState, step: int, apply_gp: bool, weight: float
    ) -> tuple[train_state.TrainState, dict[str, Any], Any]:
        cfg = self.config
        keys = train_state.critic_keys(state.key, state.iteration, step)
        real = self.sample_real(keys[0], cfg.batch_size).astype(jnp.float32)
        (loss, (wasserstein, penalty, point_sets)), grads = jax.value_and_grad(
            self._critic_loss, has_aux=True
        )(state.d_params, state.g_params, real, keys, weight, apply_gp)
        input_grad = jax.grad(lambda x: jnp.sum(self._scores(state.d_params, x)))
        if point_sets:  # (B * P,): sample b's norms at each of the P point sets, side by side
            norms = jnp.stack([naive_grad_norms(input_grad(p)) for p in point_sets], -1)
            norms = norms.reshape(-1)
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

    def _generator_loss(
        self, g_params: Any, d_params: Any, key: jax.Array, state: train_state.TrainState
    ) -> jax.Array:
        f = self._scores(d_params, self._fake(g_params, key))
        if self.config.loss == "wasserstein":
            return -jnp.mean(f)
        if self.config.loss == "non-saturating":
            return jnp.mean(jax.nn.softplus(-f))
        # relativistic: a real batch of its own, drawn with the key of critic step n_critic
        k_real = train_state.critic_keys(state.key, state.iteration, self.config.n_critic)[0]
        real = self.sample_real(k_real, self.config.batch_size).astype(jnp.float32)
        r = self._scores(d_params, real)
        return jnp.mean(jax.nn.softplus(r - f))

    def _generator_update_impl(
        self, state: train_state.TrainState
    ) -> tuple[train_state.TrainState, jax.Array, Any]:
        loss, grads = jax.value_and_grad(self._generator_loss)(
            state.g_params, state.d_params, self._generator_key(state), state
        )
        updates, g_opt = self._opt_g.update(grads, state.g_opt, state.g_params)
        state = state._replace(
            iteration=state.iteration + 1,
            g_params=optax.apply_updates(state.g_params, updates),
            g_opt=g_opt,
        )
        return state, loss, grads


__all__ = ["NaiveTrainer"]
