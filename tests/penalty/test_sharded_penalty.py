"""The penalty inside shard_map equals the single-device computation, on several mesh sizes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from fastgp import penalty
from fastgp._penalty import reference

BATCH = 24


def critic(params, x):
    return jnp.tanh(x.reshape(x.shape[0], -1) @ params["w"]) @ params["v"]


def problem():
    k1, k2, k3, k4 = jax.random.split(jax.random.PRNGKey(0), 4)
    params = {"w": jax.random.normal(k1, (2 * 70, 8)) * 0.3, "v": jax.random.normal(k2, (8,))}
    return params, jax.random.normal(k3, (BATCH, 2, 70)), jax.random.normal(k4, (BATCH, 2, 70)), k4


def sharded_value_and_grad(devices, backend, kind):
    params, real, fake, key = problem()
    mesh = Mesh(np.array(jax.devices()[:devices]), ("data",))
    data = NamedSharding(mesh, P("data"))
    real, fake = jax.device_put(real, data), jax.device_put(fake, data)
    params = jax.device_put(params, NamedSharding(mesh, P()))

    def step(params, real, fake):
        x_hat = penalty.interpolate(key, real, fake, axis_name="data")
        loss = lambda p: penalty.gradient_penalty(
            lambda y: critic(p, y), x_hat, kind=kind, backend=backend, axis_name="data"
        )
        value, grads = jax.value_and_grad(loss)(params)
        # Stack every shard's copy (out_specs P("data")) so the test can check they agree.
        return value[None], jax.tree.map(lambda g: g[None], grads)

    fn = jax.shard_map(
        step, mesh=mesh, in_specs=(P(), P("data"), P("data")), out_specs=P("data"), check_vma=True
    )
    return jax.jit(fn)(params, real, fake)


def single_device_value_and_grad(kind):
    params, real, fake, key = problem()
    x_hat = penalty.interpolate(key, real, fake)
    loss = lambda p: reference.naive_gradient_penalty(lambda y: critic(p, y), x_hat, kind=kind)
    return jax.value_and_grad(loss)(params)


@pytest.mark.parametrize(
    "devices,backend",
    [
        (1, "xla"),
        (2, "tpu-interpret"),
        (3, "xla"),
        (4, "tpu-interpret"),
        (4, "xla"),
        (8, "xla"),
        (8, "auto"),
    ],
)
@pytest.mark.parametrize("kind", ["wgan-gp", "r1"])
def test_global_penalty_and_gradients_equal_single_device(devices, backend, kind):
    values, grads = sharded_value_and_grad(devices, backend, kind)
    value_ref, grads_ref = single_device_value_and_grad(kind)
    values = np.asarray(values)
    assert values.shape == (devices,) and np.all(values == values[0]), "shards disagree"
    np.testing.assert_allclose(values[0], value_ref, rtol=1e-5)
    for name, g in grads.items():
        g = np.asarray(g)
        assert np.all(g == g[:1]), f"{name}: shards hold different gradients"
        np.testing.assert_allclose(
            g[0], grads_ref[name], rtol=1e-4, atol=1e-6 * float(jnp.max(jnp.abs(grads_ref[name])))
        )


def test_per_shard_mean_would_be_caught():
    """Sanity check of the oracle: averaging per-shard means of unequal shards differs."""
    _, real, fake, key = problem()
    norms = penalty.grad_norms(penalty.interpolate(key, real, fake), backend="xla")
    per_sample = (norms - 1.0) ** 2
    wrong = np.mean([per_sample[:20].mean(), per_sample[20:].mean()])
    assert abs(wrong - per_sample.mean()) > 1e-3 * per_sample.mean()
