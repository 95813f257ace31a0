"""The trainer's GAN losses, penalty placements, weight schedule and lazy regularisation, each
against formulas written here from their papers: the non-saturating logistic loss with lazy R1
(StyleGAN2-ADA), the relativistic pairing loss with R1 + R2 (R3GAN), APT's approximate R1.

The trainer's values are float32 and the formulas float64 (x64 in a subprocess would cost a
second JAX); each is a few reductions deep, so they agree to about 1e-6 relative on any CPU, and
the bounds of 1e-5 sit between that and the smallest bug a test here is for (a missing term, a
factor, a sign: >= 1e-2)."""

import itertools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fastgp.train.config import ConfigError, TrainConfig
from fastgp.train.models.networks import mlp
from fastgp.train.objective import losses, penalties
from fastgp.train.trainers.state import critic_keys, gp_schedule, optimizers
from fastgp.train.trainers.trainer import Trainer, make_mesh


def softplus64(x):
    x = np.asarray(x, np.float64)
    return np.maximum(x, 0.0) + np.log1p(np.exp(-np.abs(x)))


SCORES = np.array([-80.0, -3.5, -0.2, 0.0, 0.7, 4.0, 90.0], np.float32)


@pytest.mark.parametrize("loss", losses.LOSSES)
def test_loss_terms_equal_the_papers_formulas(loss):
    real, fake = SCORES, SCORES[::-1].copy()
    r, f = real.astype(np.float64), fake.astype(np.float64)
    critic, generator = {
        "wasserstein": (f - r, -f),
        "non-saturating": (softplus64(f) + softplus64(-r), softplus64(-f)),
        "relativistic": (softplus64(f - r), softplus64(r - f)),
    }[loss]
    got_critic = losses.critic_terms(loss, jnp.asarray(real), jnp.asarray(fake))
    got_generator = losses.generator_terms(loss, jnp.asarray(fake), jnp.asarray(real))
    np.testing.assert_allclose(np.asarray(got_critic, np.float64), critic, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(
        np.asarray(got_generator, np.float64), generator, rtol=1e-6, atol=1e-6
    )
    assert np.isfinite(got_critic).all() and np.isfinite(got_generator).all()
    assert losses.uses_real_in_generator(loss) == (loss == "relativistic")


def test_the_relativistic_generator_needs_reals_and_unknown_losses_are_refused():
    with pytest.raises(ValueError, match="pairs each fake with a real"):
        losses.generator_terms("relativistic", jnp.zeros(3))
    with pytest.raises(ValueError, match="unknown loss 'hinge'"):
        losses.critic_terms("hinge", jnp.zeros(3), jnp.zeros(3))  # type: ignore[arg-type]


# --- the trainer's critic step against the formulas -----------------------------------------------

LATENT = 2


def _problem():
    generator = mlp([LATENT, 16, 2], "gelu")
    critic = mlp([2, 16, 1], "gelu")
    return generator, critic, lambda key, n: jax.random.normal(key, (n, 2)) * 1.5 + 0.3


def _formula_inputs(trainer, state, step):
    """(real, fake, critic(x), input-gradient norms²(x)) of critic step ``step``, built here."""
    cfg = trainer.config
    state = jax.device_get(state)  # host copies: the formulas run on one device
    k_real, k_noise, _ = critic_keys(state.key, state.iteration, step)
    real = trainer.sample_real(k_real, cfg.batch_size).astype(jnp.float32)
    z = jax.random.normal(k_noise, (cfg.batch_size, cfg.latent_dim), jnp.float32)
    fake = trainer.generator.apply(state.g_params, z)
    scores = lambda x: np.asarray(trainer.critic.apply(state.d_params, x), np.float64).reshape(-1)
    grad = jax.grad(lambda x: jnp.sum(trainer.critic.apply(state.d_params, x)))
    sq_norms = lambda x: np.sum(np.asarray(grad(x), np.float64) ** 2, axis=1)
    return real, fake, scores, sq_norms


def _critic_step(devices=2, **fields):
    config = TrainConfig(
        batch_size=8, n_critic=2, backend="xla", latent_dim=LATENT, total_steps=40, **fields
    )
    trainer = Trainer(config, *_problem(), mesh=make_mesh(jax.devices()[:devices]))
    state = trainer.init()
    return trainer, state


def _metrics(trainer, state, step):
    metrics, _ = trainer.critic_gradients(state, np.int32(step))
    return {k: np.asarray(v) for k, v in metrics.items()}


def test_r3gan_relativistic_loss_with_r1_plus_r2():
    """R3GAN: softplus(D(fake) - D(real)) + gamma/2 (|grad D(real)|^2 + |grad D(fake)|^2), with
    gamma/2 = --gp-weight, on 2 devices, every core seeing the global values."""
    gamma = 0.4
    trainer, state = _critic_step(
        loss="relativistic", gp_kind="r1", gp_at="real+fake", gp_weight=gamma / 2
    )
    metrics = _metrics(trainer, state, 0)
    real, fake, scores, sq_norms = _formula_inputs(trainer, state, 0)
    adversarial = np.mean(softplus64(scores(fake) - scores(real)))
    penalty = gamma / 2 * (np.mean(sq_norms(real)) + np.mean(sq_norms(fake)))
    np.testing.assert_allclose(metrics["penalty"], penalty, rtol=1e-5)
    np.testing.assert_allclose(metrics["critic_loss"], adversarial + penalty, rtol=1e-5)
    gap = np.mean(scores(real)) - np.mean(scores(fake))
    np.testing.assert_allclose(metrics["wasserstein"], gap, rtol=1e-5, atol=1e-6)
    # the norm statistics span both point sets
    norms = np.sqrt(np.concatenate([sq_norms(real), sq_norms(fake)]))
    np.testing.assert_allclose(metrics["norm_max"].max(), norms.max(), rtol=1e-5)
    np.testing.assert_allclose(metrics["norm_min"].min(), norms.min(), rtol=1e-5)


@pytest.mark.parametrize("at", ["real", "fake"])
def test_r1_and_r2_are_taken_where_placed(at):
    trainer, state = _critic_step(loss="non-saturating", gp_kind="r1", gp_at=at, gp_weight=3.0)
    metrics = _metrics(trainer, state, 0)
    real, fake, _, sq_norms = _formula_inputs(trainer, state, 0)
    points = real if at == "real" else fake
    np.testing.assert_allclose(metrics["penalty"], 3.0 * np.mean(sq_norms(points)), rtol=1e-5)


def test_stylegan2_ada_non_saturating_loss_with_lazy_r1():
    """StyleGAN2-ADA: softplus(D(fake)) + softplus(-D(real)), and every 16th critic step
    16 x gamma/2 |grad D(real)|^2 (the interval's gain); the other steps the loss alone."""
    trainer, state = _critic_step(
        loss="non-saturating", gp_kind="r1", gp_weight=0.05, gp_every=16, lazy_adam=True
    )
    real, fake, scores, sq_norms = _formula_inputs(trainer, state, 0)
    adversarial = np.mean(softplus64(scores(fake)) + softplus64(-scores(real)))
    applied = _metrics(trainer, state, 0)
    assert applied["gp_applied"]
    np.testing.assert_allclose(applied["penalty"], 16 * 0.05 * np.mean(sq_norms(real)), rtol=1e-5)
    np.testing.assert_allclose(
        applied["critic_loss"], adversarial + applied["penalty"][0], rtol=1e-5
    )
    skipped = _metrics(trainer, state, 1)
    assert not skipped["gp_applied"] and np.all(skipped["penalty"] == 0)
    real, fake, scores, _ = _formula_inputs(trainer, state, 1)
    adversarial = np.mean(softplus64(scores(fake)) + softplus64(-scores(real)))
    np.testing.assert_allclose(skipped["critic_loss"], adversarial, rtol=1e-5)


def test_approximate_r1_scalings_differ_by_sigma_squared():
    """APT's lambda and the eps^2 scaling: the same noise, the penalty 1/sigma^2 apart, so that
    --approx-scale r1 reads as an exact R1 weight: its value estimates weight x |grad D|^2."""
    sigma = 0.05
    values = {}
    for scale, weight in (("lambda", 100.0), ("r1", 100.0 * sigma**2)):
        trainer, state = _critic_step(
            loss="non-saturating",
            gp_kind="approximate-r1",
            gp_at="real+fake",
            gp_sigma=sigma,
            gp_weight=weight,
            approx_scale=scale,
        )
        values[scale] = float(_metrics(trainer, state, 0)["penalty"][0])
    np.testing.assert_allclose(values["r1"], values["lambda"], rtol=1e-5)
    real, fake, _, sq_norms = _formula_inputs(trainer, state, 0)
    exact = 100.0 * sigma**2 * (np.mean(sq_norms(real)) + np.mean(sq_norms(fake)))
    # one noise draw per sample (16 of them): a noisy estimate, within a factor of 3 of R1 + R2
    assert exact / 3 < values["r1"] < 3 * exact


# --- schedule, lazy regularisation, Adam ----------------------------------------------------------


def test_cosine_weight_schedule_with_warmup():
    config = TrainConfig(
        n_critic=2,
        gp_weight=0.05,
        gp_schedule="cosine",
        gp_weight_final=0.005,
        gp_warmup=10,
        total_steps=110,
    )
    weight = lambda it: float(gp_schedule(config, it * config.n_critic)[1])
    assert weight(0) == 0.0
    assert weight(5) == pytest.approx(0.025)
    assert weight(10) == pytest.approx(0.05)
    assert weight(60) == pytest.approx(0.0275)  # half-way: the mean of both ends
    assert weight(35) == pytest.approx(0.005 + 0.045 * 0.5 * (1 + math.cos(math.pi / 4)))
    assert weight(110) == pytest.approx(0.005) and weight(500) == pytest.approx(0.005)
    decay = [weight(i) for i in range(10, 111)]
    assert all(a >= b for a, b in itertools.pairwise(decay))


def test_lazy_penalty_with_its_gain_equals_the_dense_one_in_expectation():
    """Over any gp_every consecutive critic steps the lazy weights (k x weight on one step, 0
    on the others) sum to the dense penalty's k x weight, with the schedule too."""
    cases: list[dict[str, Any]] = [
        {},
        {"gp_schedule": "cosine", "gp_weight_final": 1.0, "total_steps": 50},
    ]
    for fields in cases:
        lazy = TrainConfig(n_critic=3, gp_weight=2.0, gp_every=4, **fields)
        dense = TrainConfig(n_critic=3, gp_weight=2.0, gp_every=1, **fields)
        for start in (0, 4, 40):
            window = range(start, start + 4)
            got = sum(
                float(gp_schedule(lazy, i)[1]) * bool(gp_schedule(lazy, i)[0]) for i in window
            )
            want = 4 * float(gp_schedule(dense, start)[1])
            assert got == pytest.approx(want, rel=0.05 if fields else 1e-12)


def test_lazy_adam_is_stylegan2s_correction():
    """StyleGAN2-ADA with a penalty every 16 steps: the critic's lr x 16/17 and each beta to the
    power 16/17; the generator's Adam untouched; the same updates as optax.adam built so."""
    config = TrainConfig(lr_d=0.0025, lr_g=0.0025, betas=(0.0, 0.99), gp_every=16, lazy_adam=True)
    ratio = 16 / 17
    assert penalties.lazy_adam(0.0025, (0.0, 0.99), 16) == (
        0.0025 * ratio,
        (0.0, 0.99**ratio),
    )
    opt_g, opt_d = optimizers(config)
    want_d, want_g = optax.adam(0.0025 * ratio, 0.0, 0.99**ratio), optax.adam(0.0025, 0.0, 0.99)
    params = jnp.ones(5)
    grads = [jax.random.normal(jax.random.PRNGKey(i), (5,)) for i in range(4)]
    for got, want in ((opt_d, want_d), (opt_g, want_g)):
        s_got, s_want = got.init(params), want.init(params)
        for g in grads:
            u_got, s_got = got.update(g, s_got, params)
            u_want, s_want = want.update(g, s_want, params)
            np.testing.assert_allclose(u_got, u_want, rtol=1e-6)


@pytest.mark.parametrize(
    "fields,named",
    [
        ({"loss": "hinge"}, ("loss",)),
        ({"gp_at": "middle"}, ("gp_at",)),
        ({"gp_kind": "approximate-r1", "gp_at": "interpolates"}, ("gp_kind", "gp_at")),
        ({"gp_schedule": "cosine", "total_steps": 10}, ("gp_weight_final",)),
        ({"gp_weight_final": 0.1, "total_steps": 10}, ("gp_weight_final", "gp_schedule")),
        ({"gp_schedule": "cosine", "gp_weight_final": 0.1}, ("total_steps",)),
        (
            {"gp_schedule": "cosine", "gp_weight_final": 0.1, "total_steps": 10, "gp_warmup": 10},
            ("gp_warmup",),
        ),
        ({"lazy_adam": True}, ("lazy_adam", "gp_every")),
        ({"approx_scale": "eps"}, ("approx_scale",)),
    ],
)
def test_bad_objectives_are_refused_naming_the_fields(fields, named):
    with pytest.raises(ConfigError) as err:
        TrainConfig(**fields)
    assert err.value.fields == named


def test_default_placements_follow_the_kind():
    assert TrainConfig(gp_kind="wgan-gp").placement == "interpolates"
    assert TrainConfig(gp_kind="wgan-lp").placement == "interpolates"
    assert TrainConfig(gp_kind="r1").placement == "real"
    assert TrainConfig(gp_kind="approximate-r1").placement == "real"
    assert TrainConfig(gp_kind="r1", gp_at="fake").placement == "fake"
