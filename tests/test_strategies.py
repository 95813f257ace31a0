"""fastgp.strategies: forward-over-reverse and remat give the naive penalty's values and gradients."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from fastgp import reference, strategies
from fastgp.models import conv_critic, mlp

MODELS = {"mlp": (mlp([12, 16, 16, 1], "tanh"), (12,)),
          "conv": (conv_critic(4), (1, 8, 8))}


def problem(model_name, batch=6):
    model, shape = MODELS[model_name]
    k1, k2 = jax.random.split(jax.random.PRNGKey(1))
    return model, model.init(k1), jax.random.normal(k2, (batch,) + shape)


def naive_value_and_grads(model, params, x, kind, weight):
    loss = lambda p, y: reference.naive_gradient_penalty(
        functools.partial(model.apply, p), y, kind=kind, weight=weight)
    return jax.value_and_grad(loss, argnums=(0, 1))(params, x)


def assert_trees_close(a, b, rtol=2e-5):
    for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        scale = float(jnp.max(jnp.abs(v))) or 1.0
        np.testing.assert_allclose(u, v, rtol=rtol, atol=1e-6 * scale)


@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("kind", ["wgan-gp", "wgan-lp", "r1"])
@pytest.mark.parametrize("options", [dict(second_order="forward"), dict(remat="nothing"),
                                     dict(remat="dots"),
                                     dict(second_order="forward", remat="nothing")],
                         ids=["forward", "remat-nothing", "remat-dots", "forward+remat"])
def test_values_and_gradients_equal_naive(model_name, kind, options):
    model, params, x = problem(model_name)
    weight = 3.0
    loss = lambda p, y: strategies.gradient_penalty(
        functools.partial(model.apply, p), y, kind=kind, weight=weight, backend="xla", **options)
    value, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(params, x)
    ref_value, ref_grads = naive_value_and_grads(model, params, x, kind, weight)
    np.testing.assert_allclose(value, ref_value, rtol=1e-6)
    assert_trees_close(grads, ref_grads)


def test_forward_over_reverse_through_interpret_kernels():
    model, params, x = problem("mlp")
    loss = lambda p: strategies.gradient_penalty(functools.partial(model.apply, p), x,
                                                 backend="interpret", second_order="forward")
    value, grads = jax.value_and_grad(loss)(params)
    ref_value, (ref_grads, _) = naive_value_and_grads(model, params, x, "wgan-gp", 10.0)
    np.testing.assert_allclose(value, ref_value, rtol=1e-6)
    assert_trees_close(grads, ref_grads)


def test_forward_over_reverse_zero_gradient_is_finite():
    """A dead ReLU critic (zero input-gradient): parameter gradients stay finite (naive: NaN)."""
    model = mlp([3, 4, 1], "relu")
    params = jax.tree.map(jnp.zeros_like, model.init(jax.random.PRNGKey(0)))
    x = jnp.ones((4, 3))
    grads = jax.grad(lambda p: strategies.gradient_penalty(
        functools.partial(model.apply, p), x, backend="xla", second_order="forward"))(params)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))


@pytest.mark.parametrize("devices", [2, 4])
def test_forward_over_reverse_sharded_equals_single_device(devices):
    model, params, x = problem("mlp", batch=8)
    mesh = Mesh(np.array(jax.devices()[:devices]), ("data",))
    xs = jax.device_put(x, NamedSharding(mesh, P("data")))
    ps = jax.device_put(params, NamedSharding(mesh, P()))

    def step(p, y):
        return jax.value_and_grad(lambda q: strategies.gradient_penalty(
            functools.partial(model.apply, q), y, backend="xla", axis_name="data",
            second_order="forward"))(p)

    fn = jax.shard_map(step, mesh=mesh, in_specs=(P(), P("data")), out_specs=P(), check_vma=True)
    value, grads = jax.jit(fn)(ps, xs)
    ref_value, (ref_grads, _) = naive_value_and_grads(model, params, x, "wgan-gp", 10.0)
    np.testing.assert_allclose(value, ref_value, rtol=1e-5)
    assert_trees_close(grads, ref_grads, rtol=1e-4)


def test_unknown_options_raise():
    model, params, x = problem("mlp")
    critic = functools.partial(model.apply, params)
    with pytest.raises(ValueError, match="second_order"):
        strategies.gradient_penalty(critic, x, second_order="sideways")
    with pytest.raises(ValueError, match="remat"):
        strategies.gradient_penalty(critic, x, remat="everything")
