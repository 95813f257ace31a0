"""The generator's parameter average: the float64 recurrence it must equal, that it leaves
training alone, and where samples come from."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fastgp.train.config import ConfigError, TrainConfig
from fastgp.train.trainers.averaging import average_of, averaged, decay, sampling_params
from fastgp.train.trainers.state import optimizers


def _walk(optimizer, steps, seed=0):
    """Run ``optimizer`` on a quadratic for ``steps`` steps; the parameters after each."""
    rng = np.random.default_rng(seed)
    params = {"w": jnp.asarray(rng.standard_normal((3, 2)), jnp.float32)}
    state = optimizer.init(params)
    seen = []
    for _ in range(steps):
        grads = jax.tree.map(lambda p: p - 0.3 + 0.1 * jnp.sin(p), params)
        updates, state = optimizer.update(grads, state, params)
        params = optax.apply_updates(params, updates)
        seen.append(np.asarray(params["w"], np.float64))
    return params, state, seen


@pytest.mark.parametrize("half_life", [1, 3, 50])
def test_average_is_the_debiased_exponential_mean_of_the_parameters(half_life):
    steps = 7
    _, state, seen = _walk(averaged(optax.adam(0.1), half_life), steps)
    beta = 0.5 ** (1.0 / half_life)
    weights = np.array([(1 - beta) * beta ** (steps - 1 - i) for i in range(steps)])
    oracle = np.tensordot(weights, np.stack(seen), 1) / (1 - beta**steps)
    got = np.asarray(average_of(state, half_life)["w"])
    np.testing.assert_allclose(got, oracle, rtol=2e-6, atol=2e-6)


def test_half_life_halves_the_weight():
    assert decay(10) ** 10 == pytest.approx(0.5)


def test_the_average_does_not_change_training():
    plain, _, _ = _walk(optax.adam(0.1), 5)
    with_average, _, _ = _walk(averaged(optax.adam(0.1), 4), 5)
    np.testing.assert_array_equal(np.asarray(plain["w"]), np.asarray(with_average["w"]))


class _State:
    def __init__(self, g_params, g_opt):
        self.g_params, self.g_opt = g_params, g_opt


def test_samples_come_from_the_average_once_it_has_a_step():
    optimizer = averaged(optax.adam(0.1), 2)
    params, state, seen = _walk(optimizer, 3)
    average = sampling_params(_State(params, state), 2)
    np.testing.assert_allclose(np.asarray(average["w"]), np.asarray(average_of(state, 2)["w"]))
    assert not np.allclose(np.asarray(average["w"]), seen[-1])
    fresh = {"w": jnp.ones((3, 2))}
    assert sampling_params(_State(fresh, optimizer.init(fresh)), 2) is fresh
    assert sampling_params(_State(params, state), 0) is params


def test_config_wraps_only_the_generator_and_only_when_asked():
    base: dict[str, Any] = {"total_steps": 10, "decay_fraction": 0.5}
    params = {"w": jnp.zeros(2)}
    g_off, _ = optimizers(TrainConfig(**base))
    g_on, d_on = optimizers(TrainConfig(**base, g_average=5))
    assert len(jax.tree.leaves(g_on.init(params))) == len(jax.tree.leaves(g_off.init(params))) + 2
    assert len(jax.tree.leaves(d_on.init(params))) == len(jax.tree.leaves(g_off.init(params)))


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_config_refuses_a_bad_half_life(bad):
    with pytest.raises(ConfigError, match="g_average must be a non-negative integer"):
        TrainConfig(g_average=bad)


def test_average_of_a_state_without_one_names_the_problem():
    state = optax.adam(0.1).init({"w": jnp.zeros(2)})
    with pytest.raises(ValueError, match="no parameter average"):
        average_of(state, 3)
