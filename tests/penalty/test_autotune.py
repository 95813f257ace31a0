"""fastgp.autotune: the pick is exact, the faster variant wins where they differ, bad losses
fail."""

import functools

import jax
import jax.numpy as jnp
import pytest

import fastgp.autotune as autotune_module
from fastgp import interpolate
from fastgp.autotune import DEFAULT, Variant, autotune, candidates
from fastgp.testing import assert_penalty_matches_naive
from fastgp.train.models.networks import mlp


def conv_critic(params, x):
    """NHWC 32x32x3 -> (B,), DCGAN without batch norm: 4x4 stride-2 convs (16, 32, 64 channels),
    LeakyReLU 0.2, dense."""
    h = x
    for layer in params[:-1]:
        h = jax.lax.conv_general_dilated(
            h, layer["w"], (2, 2), ((1, 1), (1, 1)), dimension_numbers=("NHWC", "HWIO", "NHWC")
        )
        h = jax.nn.leaky_relu(h + layer["b"], 0.2)
    return h.reshape(h.shape[0], -1) @ params[-1]


def conv_params(key, widths=(3, 16, 32, 64)):
    keys = jax.random.split(key, len(widths))
    convs = [
        {"w": jax.random.normal(k, (4, 4, c_in, c_out)) / (4 * c_in**0.5), "b": jnp.zeros(c_out)}
        for k, c_in, c_out in zip(keys, widths[:-1], widths[1:], strict=False)
    ]
    return [*convs, jax.random.normal(keys[-1], (16 * widths[-1],)) / (4 * widths[-1] ** 0.5)]


def wgan_loss(apply, params, real, fake, key, *, penalty):
    critic = functools.partial(apply, params)
    x_hat = interpolate(key, real, fake)
    return critic(fake).mean() - critic(real).mean() + penalty(critic, x_hat, weight=10.0)


def batch(key, shape):
    k1, k2, k3 = jax.random.split(key, 3)
    return jax.random.normal(k1, shape), jax.random.normal(k2, shape), k3


@pytest.fixture(scope="module")
def mlp_problem():
    model = mlp([5, 32, 32, 1])
    params = model.init(jax.random.PRNGKey(0))
    return model.apply, params, *batch(jax.random.PRNGKey(1), (16, 5))


def test_the_candidates_cover_every_exact_option_with_the_default_first():
    cpu, tpu = candidates("cpu"), candidates("tpu")
    assert cpu[0] == DEFAULT and len(set(cpu)) == len(cpu) == 6
    assert {v.backend for v in cpu} == {"xla"}
    assert len(set(tpu)) == 12 and {v.backend for v in tpu} == {"xla", "pallas"}


def test_the_pick_is_exact_to_the_second_order(mlp_problem):
    apply, params, real, fake, key = mlp_problem
    tuning = autotune(functools.partial(wgan_loss, apply), params, real, fake, key, rounds=3)
    assert set(tuning.best) == {"second_order", "remat", "backend"}
    best = tuning.results[0].variant
    assert best is not None and best.options() == tuning.best
    assert all(r.problem is None for r in tuning.results)  # every CPU variant is exact
    x_hat = interpolate(key, real, fake)
    errors = assert_penalty_matches_naive(apply, params, x_hat, orders=2, **tuning.best)
    assert errors.hvp is not None and errors.hvp <= 1e-5
    assert "naive (nested jax.grad)" in tuning.table()


def test_on_a_conv_critic_it_picks_the_much_faster_second_order():
    # Reverse-over-forward avoids differentiating the convolutions' own backward: several times
    # faster on XLA:CPU here, far beyond timing noise.
    params = conv_params(jax.random.PRNGKey(0))
    real, fake, key = batch(jax.random.PRNGKey(1), (8, 32, 32, 3))
    variants = [Variant(second_order="reverse"), DEFAULT]
    tuning = autotune(
        functools.partial(wgan_loss, conv_critic),
        params,
        real,
        fake,
        key,
        variants=variants,
        rounds=3,
    )
    fast, slow = tuning.results
    assert tuning.best == DEFAULT.options()
    assert fast.seconds is not None and slow.seconds is not None and slow.variant is not None
    assert fast.seconds < slow.seconds and slow.variant.second_order == "reverse"


def test_an_inexact_variant_is_reported_and_never_picked(monkeypatch, mlp_problem):
    apply, params, real, fake, key = mlp_problem

    exact_penalty = autotune_module.gradient_penalty  # type: ignore[attr-defined]

    def wrong_when_rematerialised(critic, x, *, remat=None, **options):
        value = exact_penalty(critic, x, remat=remat, **options)
        return value * 1.001 if remat == "nothing" else value

    monkeypatch.setattr(autotune_module, "gradient_penalty", wrong_when_rematerialised)
    tuning = autotune(functools.partial(wgan_loss, apply), params, real, fake, key, rounds=2)
    bad = [r for r in tuning.results if r.problem]
    assert [r.variant and r.variant.remat for r in bad] == ["nothing", "nothing"]
    assert all((r.problem or "").startswith("not exact") and r.seconds is None for r in bad)
    assert tuning.best["remat"] != "nothing"
    assert "not exact" in tuning.table()


def test_a_loss_without_a_penalty_argument_is_a_type_error(mlp_problem):
    apply, params, real, fake, key = mlp_problem

    def loss(params, real, fake, key):
        return apply(params, real).mean()

    with pytest.raises(TypeError, match="penalty as a keyword argument"):
        autotune(loss, params, real, fake, key)


def test_a_loss_that_never_calls_the_penalty_is_refused(mlp_problem):
    apply, params, real, fake, key = mlp_problem

    def loss(params, real, fake, key, *, penalty):
        return apply(params, fake).mean() - apply(params, real).mean()

    with pytest.raises(ValueError, match="never called penalty"):
        autotune(loss, params, real, fake, key)


def test_a_loss_that_is_not_a_scalar_is_refused(mlp_problem):
    apply, params, real, fake, key = mlp_problem

    def loss(params, real, fake, key, *, penalty):
        return apply(params, real) + penalty(functools.partial(apply, params), real)

    with pytest.raises(ValueError, match=r"floating scalar.*shape \(16,\)"):
        autotune(loss, params, real, fake, key)


def test_a_loss_that_sets_a_tuned_option_itself_is_refused(mlp_problem):
    apply, params, real, fake, key = mlp_problem

    def loss(params, real, fake, key, *, penalty):
        return penalty(functools.partial(apply, params), real, backend="xla")

    with pytest.raises(ValueError, match=r"passed \['backend'\]"):
        autotune(loss, params, real, fake, key)


def test_a_reference_that_is_not_finite_is_refused(mlp_problem):
    _, params, real, fake, key = mlp_problem
    # A dead ReLU: every input-gradient is zero, and the naive backward is NaN there.
    flat = lambda params, x: jax.nn.relu(x @ params[0]["w"] - 1e3).sum(-1)

    def loss(params, real, fake, key, *, penalty):
        return penalty(functools.partial(flat, params), real)

    with pytest.raises(ValueError, match="not finite"):
        autotune(loss, params, real, fake, key)


def test_an_unknown_generation_is_refused(mlp_problem):
    apply, params, real, fake, key = mlp_problem
    with pytest.raises(ValueError, match="unknown TPU generation 'v9'"):
        autotune(functools.partial(wgan_loss, apply), params, real, fake, key, generation="v9")


@pytest.mark.aot
def test_for_a_tpu_generation_it_ranks_compiled_programs_and_checks_the_kernel(mlp_problem):
    pytest.importorskip("jax.experimental.topologies")
    apply, params, real, fake, key = mlp_problem
    variants = [DEFAULT, Variant(backend="pallas"), Variant(second_order="reverse")]
    tuning = autotune(
        functools.partial(wgan_loss, apply),
        params,
        real,
        fake,
        key,
        generation="v5e",
        variants=variants,
    )
    assert len(tuning.results) == 3 and all(r.problem is None for r in tuning.results)
    seconds = [r.seconds or 0.0 for r in tuning.results]
    assert seconds == sorted(seconds) and all(s > 0 for s in seconds)
    kernel = next(r for r in tuning.results if r.variant and r.variant.backend == "pallas")
    assert kernel.program is not None and kernel.program["kernel"]
    assert kernel.gradient_error <= 1e-5  # checked in interpret mode
    assert tuning.naive.program is not None and "v5e" in tuning.measured_on
