"""The README's framework recipes (Flax NNX, Flax Linen, Equinox, shard_map) equal the naive path.

Each test runs the code a user of that framework writes, as in the README's "Framework recipes"
section, and compares the penalty and the parameter gradients with the same computation built on
``fastgp.reference.naive_gradient_penalty`` (nested ``jax.grad``): float32, to 1e-5 of the largest
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
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from fastgp.distributed import global_mean
from fastgp.penalty import gradient_penalty, interpolate
from fastgp.reference import naive_gradient_penalty

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
    return jax.random.normal(jax.random.PRNGKey(seed), (size,) + shape, jnp.float32)


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


@nnx.jit(static_argnums=2)
def nnx_penalty_value_and_grad(model, x_hat, penalty_fn):
    def penalty_loss(model):
        return penalty_fn(lambda x: model(x), x_hat)     # close over the module

    return nnx.value_and_grad(penalty_loss)(model)


@nnx.jit
def nnx_critic_step(model, optimizer, real, fake, key):
    def loss_fn(model):
        critic = lambda x: model(x)
        x_hat = interpolate(key, real, fake)
        wasserstein = critic(real).mean() - critic(fake).mean()
        return -wasserstein + gradient_penalty(critic, x_hat)

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


def test_nnx_module_penalty_and_gradients_equal_naive():
    model = NNXCritic(rngs=nnx.Rngs(0))
    x_hat = batch(IMAGE, 1)
    value, grads = nnx_penalty_value_and_grad(model, x_hat, gradient_penalty)
    value_ref, grads_ref = nnx_penalty_value_and_grad(model, x_hat, naive_gradient_penalty)
    np.testing.assert_allclose(value, value_ref, rtol=RTOL)
    assert jax.tree.structure(grads) == jax.tree.structure(grads_ref)
    assert_close(grads, grads_ref)


def test_nnx_optimizer_step_equals_the_naive_update():
    model = NNXCritic(rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.sgd(LEARNING_RATE), wrt=nnx.Param)
    before = nnx.clone(model)
    real, fake, key = batch(IMAGE, 2), batch(IMAGE, 3), jax.random.PRNGKey(4)

    def naive_loss(model):
        critic = lambda x: model(x)
        x_hat = interpolate(key, real, fake)
        wasserstein = critic(real).mean() - critic(fake).mean()
        return -wasserstein + naive_gradient_penalty(critic, x_hat)

    loss_ref, grads_ref = nnx.jit(nnx.value_and_grad(naive_loss))(before)
    loss = nnx_critic_step(model, optimizer, real, fake, key)

    np.testing.assert_allclose(loss, loss_ref, rtol=RTOL)
    assert int(optimizer.step[...]) == 1
    params, params_before = nnx.state(model, nnx.Param), nnx.state(before, nnx.Param)
    step, step_ref = (jax.tree.map(lambda a, b: a - b, params, params_before),
                      jax.tree.map(lambda g: -LEARNING_RATE * g, grads_ref))
    assert_close(step, step_ref)


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
    params = model.init(jax.random.PRNGKey(0), real)["params"]
    state = train_state.TrainState.create(apply_fn=model.apply, params=params,
                                          tx=optax.sgd(LEARNING_RATE))

    new_state, loss, gp, grads = jax.jit(linen_critic_step)(state, real, fake, key)
    naive_step = jax.jit(functools.partial(linen_critic_step, penalty_fn=naive_gradient_penalty))
    _, loss_ref, gp_ref, grads_ref = naive_step(state, real, fake, key)

    np.testing.assert_allclose(gp, gp_ref, rtol=RTOL)
    np.testing.assert_allclose(loss, loss_ref, rtol=RTOL)
    assert_close(grads, grads_ref)
    assert int(new_state.step) == 1
    assert_close(jax.tree.map(lambda a, b: a - b, new_state.params, state.params),
                 jax.tree.map(lambda g: -LEARNING_RATE * g, grads_ref))


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
    critic = jax.vmap(model)                                 # per-sample module -> (B,) scores
    x_hat = interpolate(key, real, fake)
    wasserstein = critic(real).mean() - critic(fake).mean()
    return -wasserstein + penalty_fn(critic, x_hat)


@eqx.filter_jit
def eqx_critic_step(model, opt_state, optimizer, real, fake, key):
    loss, grads = eqx.filter_value_and_grad(eqx_critic_loss)(model, real, fake, key)
    updates, opt_state = optimizer.update(grads, opt_state, eqx.filter(model, eqx.is_array))
    return eqx.apply_updates(model, updates), opt_state, loss


def test_equinox_vmapped_module_penalty_and_gradients_equal_naive():
    model = EqxCritic(jax.random.PRNGKey(0))
    x_hat = batch((FEATURES,), 1)
    value, grads = eqx.filter_jit(eqx.filter_value_and_grad(
        lambda m: gradient_penalty(jax.vmap(m), x_hat)))(model)
    value_ref, grads_ref = eqx.filter_jit(eqx.filter_value_and_grad(
        lambda m: naive_gradient_penalty(jax.vmap(m), x_hat)))(model)
    np.testing.assert_allclose(value, value_ref, rtol=RTOL)
    assert_close(grads, grads_ref)


def test_equinox_optax_step_equals_the_naive_update():
    model = EqxCritic(jax.random.PRNGKey(0))
    optimizer = optax.sgd(LEARNING_RATE)
    opt_state = optimizer.init(eqx.filter(model, eqx.is_array))
    real, fake, key = batch((FEATURES,), 2), batch((FEATURES,), 3), jax.random.PRNGKey(4)

    new_model, _, loss = eqx_critic_step(model, opt_state, optimizer, real, fake, key)
    naive_loss = functools.partial(eqx_critic_loss, penalty_fn=naive_gradient_penalty)
    loss_ref, grads_ref = eqx.filter_jit(eqx.filter_value_and_grad(naive_loss))(
        model, real, fake, key)

    np.testing.assert_allclose(loss, loss_ref, rtol=RTOL)
    step = jax.tree.map(lambda a, b: a - b, eqx.filter(new_model, eqx.is_array),
                        eqx.filter(model, eqx.is_array))
    assert_close(step, jax.tree.map(lambda g: -LEARNING_RATE * g, grads_ref))


def test_equinox_module_without_vmap_is_an_error_not_a_wrong_penalty():
    """The per-sample module applied to a whole batch cannot give (B,) scores: it must raise."""
    model = EqxCritic(jax.random.PRNGKey(0))
    x_hat = batch((FEATURES,), 1)
    with pytest.raises(TypeError):
        gradient_penalty(model, x_hat)
    with pytest.raises(TypeError):
        eqx.filter_value_and_grad(lambda m: gradient_penalty(m, x_hat))(model)


# --- shard_map data parallelism -----------------------------------------------------------------

def mlp_critic(params, x):
    """(B, 12) -> (B,) scores from a plain parameter dict."""
    return jnp.tanh(x @ params["w1"] + params["b1"]) @ params["w2"]


def mlp_params(key):
    k1, k2 = jax.random.split(key)
    return {"w1": jax.random.normal(k1, (FEATURES, 16)) * 0.6, "b1": jnp.zeros(16),
            "w2": jax.random.normal(k2, (16,)) * 0.5}


def sharded_critic_step(params, real, fake, key):
    """Inside shard_map: real/fake are this shard's rows, params and key are replicated."""
    def loss_fn(p):
        critic = lambda x: mlp_critic(p, x)
        x_hat = interpolate(key, real, fake, axis_name="data")
        wasserstein = global_mean(critic(real), "data") - global_mean(critic(fake), "data")
        gp = gradient_penalty(critic, x_hat, axis_name="data")
        return -wasserstein + gp, gp

    (loss, gp), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
    return loss, gp, grads


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
    params = mlp_params(jax.random.PRNGKey(0))
    real, fake, key = batch((FEATURES,), 2, 16), batch((FEATURES,), 3, 16), jax.random.PRNGKey(4)
    data = NamedSharding(mesh, P("data"))
    step = jax.jit(jax.shard_map(sharded_critic_step, mesh=mesh,
                                 in_specs=(P(), P("data"), P("data"), P()),
                                 out_specs=P(), check_vma=True))

    loss, gp, grads = step(params, jax.device_put(real, data), jax.device_put(fake, data), key)
    loss_ref, gp_ref, grads_ref = jax.jit(single_device_naive_step)(params, real, fake, key)

    np.testing.assert_allclose(gp, gp_ref, rtol=RTOL)
    np.testing.assert_allclose(loss, loss_ref, rtol=RTOL)
    assert_close(grads, grads_ref)


def test_shard_map_without_axis_name_is_a_value_error():
    mesh = jax.make_mesh((4,), ("data",))
    params = mlp_params(jax.random.PRNGKey(0))
    x = batch((FEATURES,), 2, 16)

    def forgot_axis_name(params, x):
        return gradient_penalty(lambda y: mlp_critic(params, y), x)

    step = jax.shard_map(forgot_axis_name, mesh=mesh, in_specs=(P(), P("data")), out_specs=P(),
                         check_vma=True)
    with pytest.raises(ValueError, match="axis_name='data'"):
        step(params, jax.device_put(x, NamedSharding(mesh, P("data"))))
