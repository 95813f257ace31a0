"""The README's framework recipes (Flax NNX, Flax Linen, Equinox, shard_map, jax.jit with
NamedSharding, explicit sharding) equal the naive path.

Each test runs the code a user of that framework writes, as in the README's "Framework recipes"
section, and compares the penalty and the parameter gradients with the same computation built on
``fastgp.naive_gradient_penalty`` (nested ``jax.grad``): float32, to 1e-5 of the largest
reference gradient entry. The optimizer steps use SGD so that the parameters after one update can
be compared with the naive update too; Adam plugs in the same way.
"""

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen, nnx
from flax.training import train_state
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from fastgp import gradient_penalty, interpolate, naive_gradient_penalty
from fastgp.distributed import global_mean

RTOL = 1e-5
LEARNING_RATE = 0.05
FEATURES = 12
IMAGE = (8, 8, 3)


def ravel(tree):
    return np.concatenate([np.asarray(leaf, np.float32).ravel() for leaf in jax.tree.leaves(tree)])


def assert_close(ours, ref, rtol=RTOL):
    """Relative to the largest entry of the reference (so entries near 0 do not dominate)."""
    ours, ref = ravel(ours), ravel(ref)
    assert ours.shape == ref.shape
    scale = np.max(np.abs(ref))
    assert scale > 0, "the reference is identically zero: nothing is being compared"
    np.testing.assert_allclose(ours, ref, rtol=0, atol=rtol * scale)


def batch(shape, seed, size=8):
    return jnp.asarray(np.random.default_rng(seed).standard_normal((size,) + shape, np.float32))


def sgd_step(after, before):
    """The parameter change of one update, as numpy (no device ops to compile)."""
    return jax.tree.map(lambda a, b: np.asarray(a) - np.asarray(b), after, before)


def expected_sgd_step(grads):
    return jax.tree.map(lambda g: -LEARNING_RATE * np.asarray(g), grads)


# --- Flax NNX -----------------------------------------------------------------------------------


class NNXCritic(nnx.Module):
    """(B, 8, 8, 3) NHWC images -> (B, 1) scores; layer norm, never batch norm."""

    def __init__(self, *, rngs):
        self.conv = nnx.Conv(3, 8, kernel_size=(3, 3), strides=(2, 2), rngs=rngs)
        self.norm = nnx.LayerNorm(8, rngs=rngs)
        self.head = nnx.Linear(4 * 4 * 8, 1, rngs=rngs)

    def __call__(self, x):
        h = jax.nn.leaky_relu(self.norm(self.conv(x)), 0.2)
        return self.head(h.reshape(h.shape[0], -1))


def nnx_critic_loss(model, real, fake, key, penalty_fn=gradient_penalty):
    critic = lambda x: model(x)  # close over the module
    x_hat = interpolate(key, real, fake)
    wasserstein = critic(real).mean() - critic(fake).mean()
    gp = penalty_fn(critic, x_hat)
    return -wasserstein + gp, gp


@nnx.jit
def nnx_critic_step(model, optimizer, real, fake, key):
    (loss, gp), grads = nnx.value_and_grad(nnx_critic_loss, has_aux=True)(model, real, fake, key)
    optimizer.update(model, grads)
    return loss, gp


def test_nnx_module_penalty_gradients_and_optimizer_step_equal_naive():
    model = NNXCritic(rngs=nnx.Rngs(0))
    before = nnx.clone(model)
    optimizer = nnx.Optimizer(model, optax.sgd(LEARNING_RATE), wrt=nnx.Param)
    real, fake, key = batch(IMAGE, 2), batch(IMAGE, 3), jax.random.PRNGKey(4)

    loss, gp = nnx_critic_step(model, optimizer, real, fake, key)
    naive_loss = functools.partial(nnx_critic_loss, penalty_fn=naive_gradient_penalty)
    (loss_ref, gp_ref), grads_ref = nnx.jit(nnx.value_and_grad(naive_loss, has_aux=True))(
        before, real, fake, key
    )

    np.testing.assert_allclose(gp, gp_ref, rtol=RTOL)
    np.testing.assert_allclose(loss, loss_ref, rtol=RTOL)
    assert int(optimizer.step[...]) == 1
    assert_close(
        sgd_step(nnx.state(model, nnx.Param), nnx.state(before, nnx.Param)),
        expected_sgd_step(grads_ref),
    )


# --- Flax Linen with TrainState -----------------------------------------------------------------


class LinenCritic(linen.Module):
    """(B, 12) -> (B,) scores; layer norm, never batch norm."""

    width: int = 16

    @linen.compact
    def __call__(self, x):
        h = jnp.tanh(linen.LayerNorm()(linen.Dense(self.width)(x)))
        return linen.Dense(1)(h)[:, 0]


def linen_critic_step(state, real, fake, key, penalty_fn=gradient_penalty):
    def loss_fn(params):
        critic = lambda x: state.apply_fn({"params": params}, x)
        x_hat = interpolate(key, real, fake)
        wasserstein = critic(real).mean() - critic(fake).mean()
        gp = penalty_fn(critic, x_hat)
        return -wasserstein + gp, gp

    (loss, gp), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    return state.apply_gradients(grads=grads), loss, gp, grads


def test_linen_train_state_step_equals_naive():
    model = LinenCritic()
    real, fake, key = batch((FEATURES,), 2), batch((FEATURES,), 3), jax.random.PRNGKey(4)
    params = jax.jit(model.init)(jax.random.PRNGKey(0), real)["params"]
    state = train_state.TrainState.create(
        apply_fn=model.apply, params=params, tx=optax.sgd(LEARNING_RATE)
    )

    new_state, loss, gp, grads = jax.jit(linen_critic_step)(state, real, fake, key)
    naive_step = jax.jit(functools.partial(linen_critic_step, penalty_fn=naive_gradient_penalty))
    _, loss_ref, gp_ref, grads_ref = naive_step(state, real, fake, key)

    np.testing.assert_allclose(gp, gp_ref, rtol=RTOL)
    np.testing.assert_allclose(loss, loss_ref, rtol=RTOL)
    assert_close(grads, grads_ref)
    assert int(new_state.step) == 1
    assert_close(sgd_step(new_state.params, state.params), expected_sgd_step(grads_ref))


# --- Equinox ------------------------------------------------------------------------------------


class EqxCritic(eqx.Module):
    """One sample (12,) -> a scalar score, as Equinox layers are written; vmap it for a batch."""

    hidden: eqx.nn.Linear
    norm: eqx.nn.LayerNorm
    head: eqx.nn.Linear

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.hidden = eqx.nn.Linear(FEATURES, 16, key=k1)
        self.norm = eqx.nn.LayerNorm(16)
        self.head = eqx.nn.Linear(16, "scalar", key=k2)

    def __call__(self, x):
        return self.head(jnp.tanh(self.norm(self.hidden(x))))


def eqx_critic_loss(model, real, fake, key, penalty_fn=gradient_penalty):
    critic = jax.vmap(model)  # per-sample module -> (B,) scores
    x_hat = interpolate(key, real, fake)
    wasserstein = critic(real).mean() - critic(fake).mean()
    gp = penalty_fn(critic, x_hat)
    return -wasserstein + gp, gp


EQX_OPTIMIZER = optax.sgd(LEARNING_RATE)


@eqx.filter_jit
def eqx_critic_step(model, opt_state, real, fake, key):
    (loss, gp), grads = eqx.filter_value_and_grad(eqx_critic_loss, has_aux=True)(
        model, real, fake, key
    )
    updates, opt_state = EQX_OPTIMIZER.update(grads, opt_state, eqx.filter(model, eqx.is_array))
    return eqx.apply_updates(model, updates), opt_state, loss, gp


@pytest.fixture(scope="module")
def eqx_critic():
    return EqxCritic(jax.random.PRNGKey(0))


def test_equinox_vmapped_module_penalty_gradients_and_step_equal_naive(eqx_critic):
    model = eqx_critic
    opt_state = EQX_OPTIMIZER.init(eqx.filter(model, eqx.is_array))
    real, fake, key = batch((FEATURES,), 2), batch((FEATURES,), 3), jax.random.PRNGKey(4)

    new_model, _, loss, gp = eqx_critic_step(model, opt_state, real, fake, key)
    naive_loss = functools.partial(eqx_critic_loss, penalty_fn=naive_gradient_penalty)
    (loss_ref, gp_ref), grads_ref = eqx.filter_jit(
        eqx.filter_value_and_grad(naive_loss, has_aux=True)
    )(model, real, fake, key)

    np.testing.assert_allclose(gp, gp_ref, rtol=RTOL)
    np.testing.assert_allclose(loss, loss_ref, rtol=RTOL)
    assert_close(
        sgd_step(eqx.filter(new_model, eqx.is_array), eqx.filter(model, eqx.is_array)),
        expected_sgd_step(grads_ref),
    )


def test_equinox_module_without_vmap_is_an_error_not_a_wrong_penalty(eqx_critic):
    """The per-sample module applied to a whole batch cannot give (B,) scores: it must raise,
    whether passed as it is, wrapped in a lambda, or differentiated over."""
    model = eqx_critic
    x_hat = batch((FEATURES,), 1)
    with pytest.raises(TypeError):
        gradient_penalty(model, x_hat)
    with pytest.raises(TypeError):
        gradient_penalty(lambda x: model(x), x_hat)
    with pytest.raises(TypeError):
        eqx.filter_value_and_grad(lambda m: gradient_penalty(m, x_hat))(model)


# --- shard_map data parallelism -----------------------------------------------------------------


def mlp_critic(params, x):
    """(B, 12) -> (B,) scores from a plain parameter dict."""
    return jnp.tanh(x @ params["w1"] + params["b1"]) @ params["w2"]


def mlp_params(seed=0):
    rng = np.random.default_rng(seed)
    return jax.tree.map(
        jnp.asarray,
        {
            "w1": rng.standard_normal((FEATURES, 16), np.float32) * np.float32(0.6),
            "b1": np.zeros(16, np.float32),
            "w2": rng.standard_normal(16, np.float32) * np.float32(0.5),
        },
    )


SHARDED_OPTIMIZER = optax.sgd(LEARNING_RATE)


def sharded_critic_step(params, opt_state, real, fake, key):
    """Inside shard_map: real/fake are this shard's rows; params, opt_state, key are replicated."""

    def loss_fn(p):
        critic = lambda x: mlp_critic(p, x)
        x_hat = interpolate(key, real, fake, axis_name="data")
        wasserstein = global_mean(critic(real), "data") - global_mean(critic(fake), "data")
        gp = gradient_penalty(critic, x_hat, axis_name="data")
        return -wasserstein + gp, gp

    (loss, gp), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = SHARDED_OPTIMIZER.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, gp, grads


def single_device_naive_step(params, real, fake, key):
    def loss_fn(p):
        critic = lambda x: mlp_critic(p, x)
        x_hat = interpolate(key, real, fake)
        wasserstein = critic(real).mean() - critic(fake).mean()
        gp = naive_gradient_penalty(critic, x_hat)
        return -wasserstein + gp, gp

    (loss, gp), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    return loss, gp, grads


def test_shard_map_data_parallel_step_equals_one_device_naive():
    mesh = jax.make_mesh((4,), ("data",))
    data, replicated = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    real, fake, key = batch((FEATURES,), 2, 16), batch((FEATURES,), 3, 16), jax.random.PRNGKey(4)
    params = jax.device_put(mlp_params(), replicated)
    opt_state = jax.device_put(SHARDED_OPTIMIZER.init(params), replicated)
    step = jax.jit(
        jax.shard_map(
            sharded_critic_step,
            mesh=mesh,
            in_specs=(P(), P(), P("data"), P("data"), P()),
            out_specs=P(),
            check_vma=True,
        )
    )

    new_params, _, loss, gp, grads = step(
        params, opt_state, jax.device_put(real, data), jax.device_put(fake, data), key
    )
    loss_ref, gp_ref, grads_ref = jax.jit(single_device_naive_step)(mlp_params(), real, fake, key)

    np.testing.assert_allclose(gp, gp_ref, rtol=RTOL)
    np.testing.assert_allclose(loss, loss_ref, rtol=RTOL)
    assert_close(grads, grads_ref)
    assert_close(sgd_step(new_params, params), expected_sgd_step(grads_ref))


def test_shard_map_without_axis_name_is_a_value_error():
    mesh = jax.make_mesh((4,), ("data",))
    params = mlp_params()
    x = batch((FEATURES,), 2, 16)

    def forgot_axis_name(params, x):
        return gradient_penalty(lambda y: mlp_critic(params, y), x)

    step = jax.shard_map(
        forgot_axis_name, mesh=mesh, in_specs=(P(), P("data")), out_specs=P(), check_vma=True
    )
    with pytest.raises(ValueError, match="axis_name='data'"):
        step(params, jax.device_put(x, NamedSharding(mesh, P("data"))))


# --- jax.jit with NamedSharding, Auto and Explicit axes (no shard_map) --------------------------


def global_critic_step(params, opt_state, real, fake, key, backend="auto"):
    """Under jax.jit: real/fake are the global batch, sharded by their NamedSharding."""

    def loss_fn(p):
        critic = lambda x: mlp_critic(p, x)
        x_hat = interpolate(key, real, fake)
        wasserstein = critic(real).mean() - critic(fake).mean()
        gp = gradient_penalty(critic, x_hat, backend=backend)
        return -wasserstein + gp, gp

    (loss, gp), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    updates, opt_state = SHARDED_OPTIMIZER.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss, gp, grads


def assert_step_equals_one_device_naive(outputs, params, real, fake, key):
    new_params, _, loss, gp, grads = outputs
    loss_ref, gp_ref, grads_ref = jax.jit(single_device_naive_step)(mlp_params(), real, fake, key)
    np.testing.assert_allclose(gp, gp_ref, rtol=RTOL)
    np.testing.assert_allclose(loss, loss_ref, rtol=RTOL)
    assert_close(grads, grads_ref)
    assert_close(sgd_step(new_params, params), expected_sgd_step(grads_ref))


@pytest.mark.parametrize("backend", ["auto", "interpret"])
def test_jit_named_sharding_step_equals_one_device_naive(backend):
    mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(AxisType.Auto,))
    data, replicated = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    real, fake, key = batch((FEATURES,), 2, 16), batch((FEATURES,), 3, 16), jax.random.PRNGKey(4)
    params = mlp_params()
    step = jax.jit(
        functools.partial(global_critic_step, backend=backend),
        in_shardings=(replicated, replicated, data, data, replicated),
        out_shardings=replicated,
    )
    outputs = step(params, SHARDED_OPTIMIZER.init(params), real, fake, key)
    assert_step_equals_one_device_naive(outputs, params, real, fake, key)


@pytest.mark.parametrize("backend", ["auto", "interpret", "tpu-interpret"])
def test_explicit_sharding_step_equals_one_device_naive(backend):
    mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(AxisType.Explicit,))
    data, replicated = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    real, fake, key = batch((FEATURES,), 2, 16), batch((FEATURES,), 3, 16), jax.random.PRNGKey(4)
    params = jax.device_put(mlp_params(), replicated)
    with jax.set_mesh(mesh):
        step = jax.jit(functools.partial(global_critic_step, backend=backend))
        outputs = step(
            params,
            jax.device_put(SHARDED_OPTIMIZER.init(params), replicated),
            jax.device_put(real, data),
            jax.device_put(fake, data),
            key,
        )
    assert_step_equals_one_device_naive(outputs, params, real, fake, key)
