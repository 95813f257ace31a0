"""fastgp.testing: the helpers pass on fastgp's penalty, catch wrong ones by order, time steps."""

import functools
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from jax import lax

import fastgp
import fastgp.testing as fgt


def mlp():
    """tanh MLP, (B, 12) -> (B, 1); the output bias b2 gets an identically zero gradient."""
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    params = {
        "w1": jax.random.normal(k1, (12, 16)) * 0.8,
        "b1": jnp.zeros(16),
        "w2": jax.random.normal(k2, (16, 1)) * 0.5,
        "b2": jnp.zeros(1),
    }

    def apply(p, x):
        return jnp.tanh(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]

    return apply, params, jax.random.normal(k3, (6, 12))


def conv_nhwc():
    """A stride-2 NHWC convolution, tanh, a linear head: (B, 8, 8, 3) -> (B,)."""
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(1), 3)
    params = {
        "conv": jax.random.normal(k1, (3, 3, 3, 4)) * 0.4,
        "head": jax.random.normal(k2, (4 * 4 * 4,)) * 0.3,
    }

    def apply(p, x):
        h = lax.conv_general_dilated(
            x, p["conv"], (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )
        return jnp.tanh(h).reshape(h.shape[0], -1) @ p["head"]

    return apply, params, jax.random.normal(k3, (4, 8, 8, 3))


CRITICS = {"mlp": mlp, "conv-nhwc": conv_nhwc}


def input_grads(critic, x):
    return jax.grad(lambda y: jnp.sum(critic(y)))(x)


# Wrong penalties, each written as penalty_fn(critic, x) -> scalar (wgan-gp, target 1, weight 10).


def per_batch_norm_penalty(critic, x):
    """The norm of the whole batch's gradient instead of one norm per sample."""
    return 10.0 * (jnp.sqrt(jnp.sum(input_grads(critic, x) ** 2)) - 1.0) ** 2


def detached_gradient_penalty(critic, x):
    """Input-gradients cut from the graph (PyTorch's forgotten create_graph=True): right value,
    zero parameter gradient."""
    g = lax.stop_gradient(input_grads(critic, x))
    return 10.0 * jnp.mean((jnp.sqrt(jnp.sum(g**2, axis=1)) - 1.0) ** 2)


def frozen_coefficient_penalty(critic, x):
    """sg(p(n)) + sg(p'(n)) (n - sg(n)): the value and first derivative of p(n) exactly, but the
    second derivative loses its p''(n) (dn)(dn) term, so the Hessian-vector product is wrong."""
    g = input_grads(critic, x)
    n = jnp.sqrt(jnp.sum(g**2, axis=tuple(range(1, g.ndim))))
    p, dp = (n - 1.0) ** 2, 2.0 * (n - 1.0)
    surrogate = lax.stop_gradient(p) + lax.stop_gradient(dp) * (n - lax.stop_gradient(n))
    return 10.0 * jnp.mean(surrogate)


@pytest.mark.parametrize("name", list(CRITICS))
@pytest.mark.parametrize("kind", ["wgan-gp", "r1"])
def test_fastgp_penalty_matches_naive_to_second_order(name, kind):
    apply, params, x = CRITICS[name]()
    errors = fgt.assert_penalty_matches_naive(apply, params, x, kind=kind, target=0.8, weight=3.0)
    assert isinstance(errors, fgt.PenaltyErrors)
    assert all(e is not None and 0.0 <= e <= 1e-5 for e in errors)


def test_reverse_second_order_and_remat_match_naive():
    apply, params, x = mlp()
    fgt.assert_penalty_matches_naive(apply, params, x, second_order="reverse", remat="dots")


def test_orders_bounds_what_is_compared():
    apply, params, x = mlp()
    assert fgt.assert_penalty_matches_naive(apply, params, x, orders=0)[1:] == (None, None)
    assert fgt.assert_penalty_matches_naive(apply, params, x, orders=1).hvp is None
    with pytest.raises(ValueError, match="orders"):
        fgt.assert_penalty_matches_naive(apply, params, x, orders=3)


def test_kernels_in_every_interpret_mode_match_naive():
    """An NHWC image leaf (the TPU kernel reads it in its lanes view) through every kernel."""
    apply, params, x = conv_nhwc()
    errors = fgt.assert_kernels_match_naive(apply, params, x, kind="wgan-lp", target=0.8)
    assert set(errors) == {"interpret", "tpu-interpret", "gpu-interpret"}
    with pytest.raises(TypeError, match="backend"):
        fgt.assert_kernels_match_naive(apply, params, x, backend="xla")


def test_a_per_batch_norm_is_caught_at_the_value():
    apply, params, x = mlp()
    with pytest.raises(AssertionError, match=r"penalty's value differs.*> rtol=1\.0e-05"):
        fgt.assert_penalty_matches_naive(apply, params, x, penalty_fn=per_batch_norm_penalty)


def test_detached_input_gradients_are_caught_at_the_parameter_gradient():
    apply, params, x = mlp()
    with pytest.raises(
        AssertionError, match=r"parameter gradient of params\['w\d'\] differs.*error 1\.00e\+00"
    ):
        fgt.assert_penalty_matches_naive(apply, params, x, penalty_fn=detached_gradient_penalty)


def test_a_first_order_exact_surrogate_is_caught_at_the_hvp():
    apply, params, x = mlp()
    errors = fgt.assert_penalty_matches_naive(
        apply, params, x, orders=1, penalty_fn=frozen_coefficient_penalty
    )
    assert errors.value <= 1e-5 and errors.gradient is not None and errors.gradient <= 1e-5
    with pytest.raises(AssertionError, match=r"Hessian-vector product of params\[.*> rtol"):
        fgt.assert_penalty_matches_naive(apply, params, x, penalty_fn=frozen_coefficient_penalty)


def test_kernel_helper_names_the_failing_backend(monkeypatch):
    apply, params, x = mlp()
    wrong = lambda critic, y, **options: per_batch_norm_penalty(critic, y)
    monkeypatch.setattr(fgt, "gradient_penalty", wrong)
    with pytest.raises(AssertionError, match=r"^backend='interpret': the penalty's value"):
        fgt.assert_kernels_match_naive(apply, params, x)


def test_an_inactive_penalty_is_refused_not_passed():
    """wgan-lp with every norm below the target: the reference is zero, nothing is compared."""
    apply, params, x = mlp()
    with pytest.raises(ValueError, match="value is identically zero"):
        fgt.assert_penalty_matches_naive(apply, params, x, kind="wgan-lp", target=100.0)


def test_a_nan_reference_is_refused_not_passed():
    """A dead ReLU critic: zero input-gradients, where the naive gradient is NaN."""
    params = {"w": -jnp.ones((3, 4)), "v": jnp.ones((4,))}
    x = jnp.abs(jax.random.normal(jax.random.PRNGKey(0), (5, 3)))
    apply = lambda p, y: jax.nn.relu(y @ p["w"]) @ p["v"]
    with pytest.raises(ValueError, match="parameter gradient is not finite"):
        fgt.assert_penalty_matches_naive(apply, params, x, orders=1)


def make_mlp_step(penalty_fn):
    """A jitted SGD critic step on the MLP: Wasserstein loss plus penalty_fn."""
    apply, _, _ = mlp()

    def step(params, real, fake):
        def loss(p):
            critic = functools.partial(apply, p)
            x_hat = fastgp.interpolate(jax.random.PRNGKey(2), real, fake)
            return jnp.mean(critic(fake)) - jnp.mean(critic(real)) + penalty_fn(critic, x_hat)

        grads = jax.grad(loss)(params)
        return jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads)

    return jax.jit(step)


def mlp_step_args():
    _, params, real = mlp()
    return params, real, real[::-1] + 0.5


FIGURES = {"naive_s", "fastgp_s", "ratio", "paired_ratio", "rounds", "samples_s"}


def check_figures(figures, rounds):
    assert set(figures) == FIGURES and figures["rounds"] == rounds
    assert all(figures[k] > 0 for k in ("naive_s", "fastgp_s", "ratio", "paired_ratio"))
    assert figures["ratio"] == pytest.approx(figures["fastgp_s"] / figures["naive_s"])
    assert {k: len(v) for k, v in figures["samples_s"].items()} == {
        "naive": rounds,
        "fastgp": rounds,
    }


def test_compare_penalty_steps_times_both_steps_interleaved():
    built = []

    def make_step(penalty_fn):
        built.append(penalty_fn)
        return make_mlp_step(penalty_fn)

    figures = fgt.compare_penalty_steps(make_step, mlp_step_args(), rounds=4, warmup=1, kind="r1")
    check_figures(figures, rounds=4)
    assert len(built) == 2 and built[0].keywords["kind"] == built[1].keywords["kind"] == "r1"
    with pytest.raises(ValueError, match="warmup"):
        fgt.compare_penalty_steps(make_mlp_step, mlp_step_args(), warmup=0)


def test_benchmark_penalty_steps_records_the_figures(benchmark):
    figures = fgt.benchmark_penalty_steps(
        benchmark, make_mlp_step, mlp_step_args(), rounds=3, warmup=1
    )
    check_figures(figures, rounds=3)
    assert FIGURES <= set(benchmark.extra_info)


def test_importing_it_pulls_in_neither_pytest_nor_the_training_app():
    code = (
        "import sys, fastgp.testing; "
        "bad = [m for m in sys.modules if m == 'pytest' or m.startswith(('_pytest', "
        "'fastgp.train'))]; "
        "assert not bad, bad"
    )
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
