"""Inside shard_map, a forgotten axis_name is an error, never a silently per-shard mean.

Also: the explicit per-shard spelling ``axis_name=()`` equals a naive per-shard penalty,
``axis_name="data"`` still equals one device, and backends that cannot run inside shard_map say
so as clearly there as outside.
"""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from fastgp import penalty
from fastgp._penalty import reference

BATCH = 16


def critic(params, x):
    return jnp.tanh(x @ params["w"]) @ params["v"]


def problem():
    k1, k2, k3, k4, k5 = jax.random.split(jax.random.PRNGKey(0), 5)
    params = {"w": jax.random.normal(k1, (6, 8)) * 0.6, "v": jax.random.normal(k2, (8,))}
    return params, jax.random.normal(k3, (BATCH, 6)), jax.random.normal(k4, (BATCH, 6)), k5


def on_mesh(devices, fn, out_specs=P()):
    """``fn(params, real, fake, key)`` under shard_map with the batch split over "data"."""
    params, real, fake, key = problem()
    mesh = Mesh(np.array(jax.devices()[:devices]), ("data",))
    data = NamedSharding(mesh, P("data"))
    sharded = jax.shard_map(
        fn,
        mesh=mesh,
        in_specs=(P(), P("data"), P("data"), P()),
        out_specs=out_specs,
        check_vma=True,
    )
    return jax.jit(sharded)(
        jax.device_put(params, NamedSharding(mesh, P())),
        jax.device_put(real, data),
        jax.device_put(fake, data),
        key,
    )


FORGETFUL = {
    "gradient_penalty": lambda p, r, f, k: jax.grad(
        lambda q: penalty.gradient_penalty(functools.partial(critic, q), r)
    )(p),
    "gradient_penalty/reverse": lambda p, r, f, k: penalty.gradient_penalty(
        functools.partial(critic, p), r, second_order="reverse"
    ),
    "penalty_from_grads": lambda p, r, f, k: penalty.penalty_from_grads(r),
    "interpolate": lambda p, r, f, k: jnp.sum(penalty.interpolate(k, r, f)),
}


@pytest.mark.parametrize("devices", [2, 4, 8])
@pytest.mark.parametrize("name", list(FORGETFUL))
def test_forgotten_axis_name_raises_and_names_it(devices, name):
    with pytest.raises(
        ValueError, match=re.escape("('data',)") + ".*neither axis_name=None"
    ) as err:
        on_mesh(devices, FORGETFUL[name])
    # both kinds of axis are offered, each with what it means; none as the only way
    message = str(err.value)
    assert "axis_name='data' for data parallelism" in message
    assert "sample_axis_name='data' for sequence parallelism" in message
    assert "axis_name=()" in message


@pytest.mark.parametrize("devices", [2, 4, 8])
def test_per_shard_opt_out_equals_a_naive_per_shard_penalty(devices):
    def per_shard(params, real, fake, key):
        x_hat = penalty.interpolate(key, real, fake, axis_name=())
        value = penalty.gradient_penalty(functools.partial(critic, params), x_hat, axis_name=())
        return value[None], x_hat

    values, x_hat = on_mesh(devices, per_shard, out_specs=(P("data"), P("data")))
    params, real, fake, key = problem()
    local = BATCH // devices
    alpha = jax.random.uniform(key, (local,))  # every shard draws from the same key
    for shard in range(devices):
        rows = slice(shard * local, (shard + 1) * local)
        expected_x = real[rows] + alpha[:, None] * (fake[rows] - real[rows])
        np.testing.assert_allclose(x_hat[rows], expected_x, rtol=1e-6, atol=1e-7)
        naive = reference.naive_gradient_penalty(functools.partial(critic, params), expected_x)
        np.testing.assert_allclose(values[shard], naive, rtol=1e-5)
    assert np.ptp(np.asarray(values)) > 0, "shards must see different per-shard penalties"


@pytest.mark.parametrize("devices", [2, 4, 8])
def test_axis_name_data_equals_one_device(devices):
    def global_mean_penalty(params, real, fake, key):
        x_hat = penalty.interpolate(key, real, fake, axis_name="data")
        loss = lambda p: penalty.gradient_penalty(
            functools.partial(critic, p), x_hat, axis_name="data"
        )
        return jax.value_and_grad(loss)(params)

    value, grads = on_mesh(devices, global_mean_penalty)
    params, real, fake, key = problem()
    x_hat = penalty.interpolate(key, real, fake)
    loss = lambda p: reference.naive_gradient_penalty(functools.partial(critic, p), x_hat)
    ref_value, ref_grads = jax.value_and_grad(loss)(params)
    np.testing.assert_allclose(value, ref_value, rtol=1e-5)
    for name in params:
        scale = float(jnp.max(jnp.abs(ref_grads[name])))
        np.testing.assert_allclose(grads[name], ref_grads[name], rtol=0, atol=1e-5 * scale)


def test_replicated_data_needs_no_axis_name():
    """Data that does not vary over the mesh (every shard holds the same batch) is fine."""
    params, real, _, _ = problem()
    mesh = Mesh(np.array(jax.devices()[:2]), ("data",))
    fn = jax.shard_map(
        lambda p, x: penalty.gradient_penalty(functools.partial(critic, p), x),
        mesh=mesh,
        in_specs=(P(), P()),
        out_specs=P(),
        check_vma=True,
    )
    expected = reference.naive_gradient_penalty(functools.partial(critic, params), real)
    np.testing.assert_allclose(jax.jit(fn)(params, real), expected, rtol=1e-5)


def test_pallas_on_a_cpu_lowering_is_the_same_clear_error_inside_shard_map():
    message = "backend=.pallas.*lowered for another platform.*.interpret."
    with pytest.raises(ValueError, match=message):
        on_mesh(
            2,
            lambda p, r, f, k: penalty.gradient_penalty(
                functools.partial(critic, p), r, backend="pallas", axis_name="data"
            ),
        )


@pytest.mark.parametrize("backend", ["interpret", "gpu-interpret"])
def test_generic_interpret_mode_inside_shard_map_names_tpu_interpret(backend):
    with pytest.raises(ValueError, match="tpu-interpret"):
        on_mesh(
            2,
            lambda p, r, f, k: penalty.gradient_penalty(
                functools.partial(critic, p), r, backend=backend, axis_name="data"
            ),
        )


def test_axis_name_must_be_a_name():
    with pytest.raises(TypeError, match="axis_name"):
        penalty.gradient_penalty(lambda x: jnp.sum(x, axis=1), jnp.ones((2, 3)), axis_name=3)  # type: ignore[arg-type]
