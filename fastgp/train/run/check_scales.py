"""The error scales R and E of each quantity of one naive step (``fastgp.train.run.check_bounds``
says what they are and why).

    scales = StepScales(naive)
    scales.critic(state, step)  -> {"wasserstein", "critic_loss", "penalty", "critic_grads":
                                    Scale; "norms": (n, e) per sample; "drift": gradients}
    scales.generator(state)     -> {"generator_loss", "generator_grads": Scale; "drift": ...}

Everything is recomputed at the naive state the step starts from with the naive trainer's own
pieces (networks, random numbers, penalty points), one sample at a time: the scores and their
parameter Jacobians, the input-gradient norms and theirs, each term's magnitude, and one
forward-mode derivative of all of it along the probe (every parameter of every network
evaluation moved by its own size times a random sign).
"""

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

# Private on purpose: the error scales recompute the naive step's own pieces (the approximation's
# perturbation, the plain-jnp norms and penalties), not the public entry points that wrap them.
from fastgp._approximate.api import perturb
from fastgp._penalty.reference import naive_grad_norms, naive_penalties
from fastgp.train.objective.losses import critic_terms, generator_terms, uses_real_in_generator
from fastgp.train.objective.penalties import approximate_weight
from fastgp.train.trainers import state as train_state
from fastgp.train.trainers.naive_trainer import NaiveTrainer


class Scale(NamedTuple):
    """One quantity's error scales at one step (``fastgp.train.run.check_bounds``): the
    reduction's R and the evaluation's E, each a float or a pytree of arrays like the quantity's."""

    reduction: Any
    evaluation: Any


def longest_contraction(*params: Any) -> int:
    """K: the longest sum of products in one sample's pass, the largest fan-in of a weight array
    (a leaf of two or more axes contracts all but its last: (in, out) dense matrices, (h, w, in,
    out) convolution kernels)."""
    fan_ins = [math.prod(a.shape[:-1]) for p in params for a in jax.tree.leaves(p) if a.ndim > 1]
    return max(fan_ins, default=1)


def _term(fn: Any, *inputs: jax.Array) -> tuple[Any, ...]:
    """Per sample b, for a term t = fn(s_1, ...) of per-sample scores (or norms) s_i: t_b, each
    dt/ds_i, the term's magnitude |t| + sum_i |dt/ds_i| |s_i|, and each input's weight in the
    magnitude of the term's gradient, |dt/ds_i| + sum_j |d2t/ds_i ds_j| |s_j| (the chain rule's
    factor, and the rounding of the s_j it is computed from)."""

    def one(*s: jax.Array) -> jax.Array:
        return fn(*(x[None] for x in s))[0]

    argnums = tuple(range(len(inputs)))
    t = jax.vmap(one)(*inputs)
    d1 = jax.vmap(jax.grad(one, argnums=argnums))(*inputs)
    d2 = jax.vmap(jax.hessian(one, argnums=argnums))(*inputs)
    size = [jnp.abs(s) for s in inputs]
    magnitude = jnp.abs(t) + sum(jnp.abs(d) * m for d, m in zip(d1, size, strict=True))
    weights = [jnp.abs(d1[i]) + sum(jnp.abs(d2[i][j]) * size[j] for j in argnums) for i in argnums]
    return t, d1, magnitude, weights


def _per_sample_grads(fn: Any, params: Any, inputs: jax.Array) -> Any:
    """(B, ...) leaves: the gradient in ``params`` of ``fn(params, x)``, a scalar of the one sample
    ``x`` (1, ...), for every sample of ``inputs`` (B, ...). One backward pass per sample, where
    ``jax.jacrev`` of the batch's B outputs would take B passes over the whole batch."""
    return jax.vmap(jax.grad(lambda p, x: fn(p, x[None])), in_axes=(None, 0))(params, inputs)


def _times(w: jax.Array, tree: Any, absolute: bool = False) -> Any:
    """w_b * tree_b (``absolute``: w_b * |tree_b|) for a pytree of (B, ...) per-sample leaves."""

    def one(j: jax.Array) -> jax.Array:
        return w.reshape(w.shape + (1,) * (j.ndim - 1)) * (jnp.abs(j) if absolute else j)

    return jax.tree.map(one, tree)


def _sum(*trees: Any) -> Any:
    return jax.tree.map(lambda *leaves: sum(leaves[1:], leaves[0]), *trees)


def _batch_mean(tree: Any) -> Any:
    return jax.tree.map(lambda leaf: jnp.mean(leaf, 0), tree)


def _random_signs(key: jax.Array, tree: Any) -> Any:
    """``tree`` with each entry's sign flipped at random: the probe."""
    leaves, treedef = jax.tree.flatten(tree)
    keys = jax.random.split(key, len(leaves))
    signed = [
        a * jax.random.rademacher(k, a.shape, a.dtype) for a, k in zip(leaves, keys, strict=True)
    ]
    return jax.tree.unflatten(treedef, signed)


def _probed(per_sample: Any, theta: Any, key: jax.Array) -> tuple[dict[str, Scale], Any]:
    """({name: Scale(R, E)}, (aux, values, probes)) of ``per_sample(theta) -> (values,
    (magnitudes, aux))``, its (B, ...) values' R the batch mean of their magnitudes and E the
    root sum of squares over the batch, divided by B, of their derivative along the probe."""
    probe = _random_signs(key, theta)
    values, probes, (magnitudes, aux) = jax.jvp(per_sample, (theta,), (probe,), has_aux=True)
    scales = {}
    for name, value in values.items():
        batch = jax.tree.leaves(value)[0].shape[0]
        evaluation = jax.tree.map(lambda p, b=batch: jnp.sqrt(jnp.sum(p * p, 0)) / b, probes[name])
        scales[name] = Scale(_batch_mean(magnitudes[name]), evaluation)
    return scales, (aux, values, probes)


class StepScales:
    """The scales of one naive step's quantities (module docstring); ``k`` the networks' longest
    contraction K, ``sample_size`` the size D of one real sample."""

    def __init__(self, naive: NaiveTrainer) -> None:
        self.naive = naive
        start = train_state.init_state(naive.config, naive.generator, naive.critic)
        self.k = longest_contraction(start.g_params, start.d_params)
        sample = jax.eval_shape(lambda: naive.sample_real(jax.random.PRNGKey(0), 1))
        self.sample_size = math.prod(sample.shape[1:])
        self._critic = jax.jit(self._critic_scales, static_argnums=2)
        self._generator = jax.jit(self._generator_scales)

    def critic(self, state: train_state.TrainState, step: int) -> dict[str, Any]:
        """Critic step ``step`` at ``state``: Scale of "wasserstein", "critic_loss", "penalty"
        and "critic_grads"; "norms": per-sample (n_b, e_b) in the naive metrics' (B * P,)
        layout; "drift": the three values' gradients with respect to the critic's parameters."""
        cfg = self.naive.config
        apply_gp, weight = train_state.gp_schedule(cfg, int(state.iteration) * cfg.n_critic + step)
        return jax.device_get(self._critic(state, step, bool(apply_gp), weight))

    def generator(self, state: train_state.TrainState) -> dict[str, Any]:
        """The generator step at ``state``: Scale of "generator_loss" and "generator_grads";
        "drift": the loss's gradient with respect to the critic's parameters."""
        return jax.device_get(self._generator(state))

    def _score_grads(self, params: Any, inputs: jax.Array) -> Any:
        """Per sample: the gradient of its score in the critic's parameters."""
        return _per_sample_grads(lambda p, x: self.naive._scores(p, x)[0], params, inputs)

    # --- the critic step -----------------------------------------------------------------------

    def _critic_scales(
        self, state: train_state.TrainState, step: Any, apply_gp: bool, weight: Any
    ) -> dict[str, Any]:
        cfg = self.naive.config
        keys = train_state.critic_keys(state.key, state.iteration, step)
        real = self.naive.sample_real(keys[0], cfg.batch_size).astype(jnp.float32)
        z = jax.random.normal(keys[1], (cfg.batch_size, cfg.latent_dim), jnp.float32)
        sets = 2 if cfg.placement == "real+fake" else 1
        calls = (2 * sets if cfg.gp_kind == "approximate-r1" else sets) if apply_gp else 0
        # One copy of the critic's parameters per network evaluation, each with its own signs.
        d = state.d_params
        theta = {"generator": state.g_params, "real": d, "fake": d, "penalty": [d] * calls}

        def per_sample(th: dict[str, Any]) -> tuple[dict[str, Any], Any]:
            fake = self.naive.generator.apply(th["generator"], z, dtype=cfg.dtype)
            return self._critic_terms(th, real, fake.astype(jnp.float32), keys[2], weight)

        key = jax.random.fold_in(keys[0], 1)
        scales, (drift, values, probes) = _probed(per_sample, theta, key)
        del scales["norms"]  # per sample: each norm and its probe, compared per core
        return {**scales, "norms": (values["norms"], jnp.abs(probes["norms"])), "drift": drift}

    def _critic_terms(
        self, th: dict[str, Any], real: jax.Array, fake: jax.Array, key: jax.Array, weight: Any
    ) -> tuple[dict[str, Any], Any]:
        """Per sample: the critic step's values and gradients, (their magnitudes, the values'
        gradients for the drift). The norms are their own magnitude (a sum of squares)."""
        score, jacobian = self.naive._scores, self._score_grads
        r, j_r = score(th["real"], real), jacobian(th["real"], real)
        f, j_f = score(th["fake"], fake), jacobian(th["fake"], fake)
        loss, (dl_r, dl_f), loss_size, (w_r, w_f) = _term(
            functools.partial(critic_terms, self.naive.config.loss), r, f
        )
        loss_grads = _sum(_times(dl_r, j_r), _times(dl_f, j_f))
        loss_grad_size = _sum(_times(w_r, j_r, True), _times(w_f, j_f, True))
        penalty, penalty_size, penalty_grads, penalty_grad_size, norms = self._penalty(
            th["real"], th["penalty"], real, fake, key, weight
        )
        grads = _sum(loss_grads, penalty_grads)
        values = {
            "wasserstein": r - f,
            "critic_loss": loss + penalty,
            "penalty": penalty,
            "critic_grads": grads,
            "norms": norms,
        }
        sizes = {
            "wasserstein": jnp.abs(r) + jnp.abs(f),
            "critic_loss": loss_size + penalty_size,
            "penalty": penalty_size,
            "critic_grads": _sum(loss_grad_size, penalty_grad_size),
            "norms": norms,
        }
        drift = {
            "wasserstein": _batch_mean(_sum(j_r, jax.tree.map(jnp.negative, j_f))),
            "critic_loss": _batch_mean(grads),
            "penalty": _batch_mean(penalty_grads),
        }
        return values, (sizes, drift)

    def _penalty(
        self, like: Any, params: list[Any], real: jax.Array, fake: jax.Array, key: Any, weight: Any
    ) -> tuple[Any, ...]:
        """Per sample: the penalty's terms, their magnitudes, its gradients, theirs, and the
        (B * P,) norms (zeros for the approximate kind, or where no penalty is taken), summed over
        the placement's point sets; ``params``: one copy of the critic's per evaluation."""
        batch = real.shape[0]
        zero = jnp.zeros((batch,), jnp.float32)
        grads = jax.tree.map(lambda a: jnp.zeros((batch, *a.shape), a.dtype), like)
        parts = [(zero, zero, grads, grads)]
        norms = []
        for i, points in enumerate(self.naive._penalty_points(real, fake, key) if params else []):
            if self.naive.config.gp_kind == "approximate-r1":
                noisy = perturb(
                    jax.random.fold_in(key, i), points, self.naive.config.gp_sigma, None
                )
                parts.append(self._approximate(params[2 * i : 2 * i + 2], points, noisy, weight))
            else:
                *part, n = self._exact(params[i], points, weight)
                parts.append(tuple(part))
                norms.append(n)
        total = tuple(_sum(*column) for column in zip(*parts, strict=True))
        return (*total, jnp.stack(norms, -1).reshape(-1) if norms else zero)

    def _exact(self, params: Any, points: jax.Array, weight: Any) -> tuple[Any, ...]:
        """weight * phi(n_b), n_b the input-gradient's norm: its magnitude weight (|phi| +
        |phi'| n) and its gradient's, weight (|phi'| + |phi''| n) |dn/dtheta| (phi' vanishes at
        WGAN-GP's target, where the rounding of n still moves the gradient)."""
        cfg, score = self.naive.config, self.naive._scores

        def norms_of(p: Any, x: jax.Array) -> jax.Array:
            return naive_grad_norms(jax.grad(lambda y: jnp.sum(score(p, y)))(x))

        n = norms_of(params, points)
        j_n = _per_sample_grads(lambda p, x: norms_of(p, x)[0], params, points)
        kind = functools.partial(naive_penalties, kind=cfg.exact_kind, target=cfg.gp_target)
        phi, (dphi,), size, (w_n,) = _term(kind, n)
        return (
            weight * phi,
            weight * size,
            _times(weight * dphi, j_n),
            _times(weight * w_n, j_n, True),
            n,
        )

    def _approximate(
        self, params: list[Any], points: jax.Array, noisy: jax.Array, weight: Any
    ) -> tuple[Any, ...]:
        """lam delta_b^2, delta_b = D(x_b + sigma eps_b) - D(x_b), which cancels all but about
        sigma of each score: magnitude lam (delta^2 + 2 |delta| m), m = |D(x + sigma eps)| +
        |D(x)| the size of what delta subtracts; its gradient 2 lam delta (J_noisy - J_clean)
        (J the scores' parameter Jacobians), magnitude 2 lam (m |J_noisy - J_clean| + |delta|
        (|J_noisy| + |J_clean|)): delta's rounding times the difference, delta times the
        difference's rounding."""
        cfg, score, jacobian = self.naive.config, self.naive._scores, self._score_grads
        lam = approximate_weight(weight, cfg.gp_sigma, cfg.approx_scale)
        (clean_params, noisy_params) = params
        clean, shifted = score(clean_params, points), score(noisy_params, noisy)
        j_clean, j_noisy = jacobian(clean_params, points), jacobian(noisy_params, noisy)
        delta, size = shifted - clean, jnp.abs(shifted) + jnp.abs(clean)
        j_delta = _sum(j_noisy, jax.tree.map(jnp.negative, j_clean))
        return (
            lam * delta**2,
            lam * (delta**2 + 2 * jnp.abs(delta) * size),
            _times(2 * lam * delta, j_delta),
            _sum(
                _times(2 * lam * size, j_delta, True),
                _times(
                    2 * lam * jnp.abs(delta),
                    _sum(jax.tree.map(jnp.abs, j_noisy), jax.tree.map(jnp.abs, j_clean)),
                ),
            ),
        )

    # --- the generator step --------------------------------------------------------------------

    def _generator_scales(self, state: train_state.TrainState) -> dict[str, Any]:
        cfg = self.naive.config
        key = train_state.generator_key(state.key, state.iteration, cfg.n_critic)
        z = jax.random.normal(key, (cfg.batch_size, cfg.latent_dim), jnp.float32)
        real = None
        if uses_real_in_generator(cfg.loss):
            k_real = train_state.critic_keys(state.key, state.iteration, cfg.n_critic)[0]
            real = self.naive.sample_real(k_real, cfg.batch_size).astype(jnp.float32)
        theta = {"generator": state.g_params, "fake": state.d_params, "real": state.d_params}

        def per_sample(th: dict[str, Any]) -> tuple[dict[str, Any], Any]:
            t, size, grads, grad_size = self._generator_terms(th, z, real)
            sizes = {"generator_loss": size, "generator_grads": grad_size}
            return {"generator_loss": t, "generator_grads": grads}, (sizes, None)

        def mean_loss(critic: Any) -> jax.Array:
            return jnp.mean(
                self._generator_terms({**theta, "fake": critic, "real": critic}, z, real)[0]
            )

        scales, _ = _probed(per_sample, theta, jax.random.fold_in(key, 1))
        return {**scales, "drift": {"generator_loss": jax.grad(mean_loss)(state.d_params)}}

    def _generator_terms(
        self, th: dict[str, Any], z: jax.Array, real: jax.Array | None
    ) -> tuple[Any, ...]:
        """Per sample: the generator's loss terms, their magnitudes, their gradients with respect
        to the generator's parameters, and those gradients' magnitudes."""
        cfg = self.naive.config

        def fake_scores(g: Any, z: jax.Array) -> jax.Array:
            fake = self.naive.generator.apply(g, z, dtype=cfg.dtype).astype(jnp.float32)
            return self.naive._scores(th["fake"], fake)

        f = fake_scores(th["generator"], z)
        j_f = _per_sample_grads(lambda g, z: fake_scores(g, z)[0], th["generator"], z)
        if real is None:
            t, (dt_f,), size, (w_f,) = _term(lambda f: generator_terms(cfg.loss, f), f)
        else:
            r = self.naive._scores(th["real"], real)
            pair = lambda f, r: generator_terms(cfg.loss, f, r)
            t, (dt_f, _), size, (w_f, _) = _term(pair, f, r)
        return t, size, _times(dt_f, j_f), _times(w_f, j_f, True)


__all__ = ["Scale", "StepScales", "longest_contraction"]
