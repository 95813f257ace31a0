"""fastgp.approximate_r1: its formula, what it estimates, first-order-only ops, sharding, errors.

The oracles are independent of the implementation: the perturbed points are read back from the
critic's own inputs, so the formula ``weight * mean_b (D(x_b + sigma eps_b) - D(x_b))**2`` is
recomputed from them in plain jnp; the estimate is compared with the exact R1 of
``fastgp.gradient_penalty(kind="r1")``; the sharded value with the single-device one.
Identities are asserted in float64 (``F64_RTOL``): ``D(x + sigma eps) - D(x)`` cancels all but
~sigma of each score, so one float32 rounding step of a score is ~1e-5 of the result; bf16 critics
are compared with the same bf16 operations.
"""

from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import fastgp
from fastgp import approximate_r1

FEATURES, HIDDEN, BATCH = 6, 16, 16
# float64 rounding, amplified ~100x by the cancellation above: ~1e-14 of the largest entry.
F64_RTOL = 1e-12


def params_of(seed=0, scale=1.0):
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    return {
        "w": scale * jax.random.normal(k1, (FEATURES, HIDDEN)) / np.sqrt(FEATURES),
        "b": jax.random.normal(k2, (HIDDEN,)) * 0.5,
        "v": jax.random.normal(k3, (HIDDEN,)) / np.sqrt(HIDDEN),
    }


def apply_critic(p, x, dtype=None, act=jnp.tanh):
    """Smooth MLP critic (B, FEATURES) -> (B,) computed in ``dtype`` (x's by default)."""
    dtype = x.dtype if dtype is None else dtype
    p = jax.tree.map(lambda a: a.astype(dtype), p)
    return act(x.astype(dtype) @ p["w"] + p["b"]) @ p["v"]


def data(seed=1, batch=BATCH, dtype=jnp.float32):
    return jax.random.normal(jax.random.key(seed), (batch, FEATURES)).astype(dtype)


def recorded_points(critic, x, key, sigma):
    """The perturbed points approximate_r1 evaluated the critic at, read from the critic's inputs
    (an eager call: the inputs are concrete arrays)."""
    seen = []

    def recording(y):
        seen.append(y)
        return critic(y)

    approximate_r1(recording, x, key, sigma=sigma, weight=1.0)
    assert len(seen) == 2, "expected one clean and one perturbed evaluation"
    equal = [
        all(jax.tree.leaves(jax.tree.map(lambda a, b: bool(jnp.all(a == b)), y, x))) for y in seen
    ]
    assert sorted(equal) == [False, True], "one call must be at x itself"
    return seen[equal.index(False)]


def formula(critic, x, noisy, weight):
    """weight * mean_b (D(noisy_b) - D(x_b))**2, differences and squares in float32 (or wider)."""
    clean, perturbed = critic(x).reshape(-1), critic(noisy).reshape(-1)
    dtype = jnp.promote_types(clean.dtype, jnp.float32)
    d = perturbed.astype(dtype) - clean.astype(dtype)
    return weight * jnp.mean(d**2)


# --- the formula -------------------------------------------------------------------------------


def test_noise_is_standard_normal_per_sample_and_deterministic():
    x = data(batch=512)
    key = jax.random.key(7)
    critic = lambda y: apply_critic(params_of(), y)
    eps = np.asarray((recorded_points(critic, x, key, 0.5) - x) / 0.5, np.float64)
    n = eps.size
    assert abs(eps.mean()) < 4 / np.sqrt(n)
    assert abs(eps.var() - 1) < 4 * np.sqrt(2 / n)
    # independent across samples and features: the sample correlation matrix is near identity
    corr = np.corrcoef(eps.T)
    assert np.max(np.abs(corr - np.eye(FEATURES))) < 4 / np.sqrt(eps.shape[0])
    again = recorded_points(critic, x, key, 0.5)
    other = recorded_points(critic, x, jax.random.key(8), 0.5)
    np.testing.assert_array_equal(again, x + 0.5 * eps.astype(np.float32))
    assert not np.allclose(other, again)


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.bfloat16])
def test_value_and_parameter_gradients_equal_the_formula(dtype):
    """float64 to float64's rounding; a bf16 critic to 1e-6, the same bf16 scores on both sides
    squared in float32 (a float32 step is 6e-8)."""
    with jax.enable_x64(dtype == jnp.float64):
        params, x, key, sigma, weight = (
            params_of(),
            data(dtype=dtype),
            jax.random.key(3),
            0.05,
            100.0,
        )
        noisy = recorded_points(lambda y: apply_critic(params, y, dtype), x, key, sigma)
        assert noisy.dtype == x.dtype

        def ours(p):
            return approximate_r1(
                lambda y: apply_critic(p, y, dtype), x, key, sigma=sigma, weight=weight
            )

        def reference(p):
            return formula(lambda y: apply_critic(p, y, dtype), x, noisy, weight)

        value, grads = jax.value_and_grad(ours)(params)
        ref_value, ref_grads = jax.value_and_grad(reference)(params)
    assert value.dtype == jnp.promote_types(dtype, jnp.float32)
    rtol = F64_RTOL if dtype == jnp.float64 else 1e-6
    np.testing.assert_allclose(value, ref_value, rtol=rtol)
    for name in params:
        scale = float(np.max(np.abs(ref_grads[name])))
        assert scale > 0
        np.testing.assert_allclose(grads[name], ref_grads[name], rtol=0, atol=rtol * scale)


def test_bf16_scores_are_squared_and_averaged_in_float32():
    params, x, key = params_of(), data(dtype=jnp.bfloat16), jax.random.key(3)
    critic = lambda y: apply_critic(params, y, jnp.bfloat16)
    noisy = recorded_points(critic, x, key, 0.05)
    value = approximate_r1(critic, x, key, sigma=0.05, weight=1.0)
    exact = np.mean(
        (np.asarray(critic(noisy), np.float64) - np.asarray(critic(x), np.float64)) ** 2
    )
    np.testing.assert_allclose(value, exact, rtol=1e-6)
    # The same in bf16 arithmetic is visibly off, so the comparison above can fail.
    d = critic(noisy) - critic(x)
    in_bf16 = jnp.mean(d * d, dtype=jnp.bfloat16)
    assert abs(float(in_bf16) - exact) > 1e-6 * exact


@jax.enable_x64(True)
def test_pytree_input_perturbs_every_leaf_independently():
    k1, k2 = jax.random.split(jax.random.key(4))
    x = {"a": jax.random.normal(k1, (BATCH, 3)), "b": jax.random.normal(k2, (BATCH, 2, 2))}
    w = {"a": jnp.arange(1.0, 4.0), "b": jnp.ones((2, 2))}
    assert x["a"].dtype == jnp.float64

    def critic(y):
        return jnp.tanh(y["a"] @ w["a"]) + jnp.sum(jnp.sin(y["b"]) * w["b"], axis=(1, 2))

    noisy = recorded_points(critic, x, jax.random.key(5), 0.1)
    value = approximate_r1(critic, x, jax.random.key(5), sigma=0.1, weight=2.0)
    np.testing.assert_allclose(value, formula(critic, x, noisy, 2.0), rtol=F64_RTOL)
    ea, eb = noisy["a"] - x["a"], noisy["b"] - x["b"]
    assert not np.allclose(ea[:, :2], eb[:, 0, :]), "leaves share one noise stream"


# --- what it estimates -------------------------------------------------------------------------

DRAWS = 16000
Z = 4.0  # bounds at 4 standard errors: a false failure has probability ~6e-5 per bound


def per_draw(critic, x, sigma):
    """approximate_r1 with weight 1 for DRAWS independent keys, (DRAWS,) float64."""
    keys = jax.random.split(jax.random.key(11), DRAWS)
    run = jax.jit(jax.vmap(lambda k: approximate_r1(critic, x, k, sigma=sigma, weight=1.0)))
    return np.asarray(run(keys), np.float64)


def test_ratio_to_sigma_squared_r1_tends_to_one():
    """r(s) = approximate_r1 / (s² R1) has E r = 1 + b s² + O(s⁴). The linearised critic
    y -> ⟨g_b, y_b⟩ sees the same noise (same keys) and gives L with E L = 1 exactly, so
    r(s) - L isolates the bias with little noise; both means are bounded by their standard
    errors over the draws."""
    params, x = params_of(scale=5.0), data()
    critic = lambda y: apply_critic(params, y)
    r1 = float(fastgp.gradient_penalty(critic, x, kind="r1", weight=1.0))
    g = jax.grad(lambda y: jnp.sum(critic(y)))(x)
    linear = per_draw(lambda y: jnp.sum(y * g, axis=1), x, 1.0) / r1
    se_linear = linear.std() / np.sqrt(DRAWS)
    assert abs(linear.mean() - 1) < Z * se_linear

    bias, gap = {}, {}
    for sigma in (0.1, 0.01, 0.001):
        ratio = per_draw(critic, x, sigma) / (sigma**2 * r1)
        diff = ratio - linear
        bias[sigma] = (diff.mean(), diff.std() / np.sqrt(DRAWS))
        gap[sigma] = (abs(ratio.mean() - 1), ratio.std() / np.sqrt(DRAWS))
    mean, se = bias[0.1]
    assert abs(mean) > Z * se, f"no bias detected at sigma 0.1 ({mean} ± {se}): weak curvature"
    assert gap[0.1][0] > Z * gap[0.1][1], "the sigma=0.1 ratio should be visibly off 1"
    # the bias scales as sigma**2: 100x smaller per decade (within the standard errors)
    for big, small in ((0.1, 0.01), (0.01, 0.001)):
        expected = bias[big][0] / 100
        assert abs(bias[small][0] - expected) < Z * bias[small][1] + Z * bias[big][1] / 100 + 1e-4
    for sigma in (0.01, 0.001):
        assert gap[sigma][0] < Z * gap[sigma][1] + abs(bias[sigma][0])
        assert gap[sigma][0] < gap[0.1][0]


# --- first-order-only critics ------------------------------------------------------------------


@jax.custom_vjp
def _no_second_order(y):
    return y


def _no_second_order_fwd(y):
    return y, None


def _no_second_order_bwd(_, ct):
    raise RuntimeError("a second derivative was taken through the critic")


_no_second_order.defvjp(_no_second_order_fwd, _no_second_order_bwd)


@jax.custom_vjp
def custom_tanh(y):
    """tanh whose backward can be taken once: differentiating the backward calls the inner
    custom_vjp's backward, which raises (a stand-in for a Pallas kernel's backward)."""
    return jnp.tanh(y)


def _custom_tanh_fwd(y):
    t = jnp.tanh(y)
    return t, t


def _custom_tanh_bwd(t, ct):
    return (_no_second_order(ct * (1 - t * t)),)


custom_tanh.defvjp(_custom_tanh_fwd, _custom_tanh_bwd)


@jax.enable_x64(True)
def test_runs_on_a_critic_whose_ops_have_only_a_first_order_vjp():
    params, x, key = params_of(), data(dtype=jnp.float64), jax.random.key(6)
    critic_of = lambda p: lambda y: apply_critic(p, y, act=custom_tanh)
    plain_of = lambda p: lambda y: apply_critic(p, y)
    noisy = recorded_points(critic_of(params), x, key, 0.05)

    ours = lambda p: approximate_r1(critic_of(p), x, key, sigma=0.05, weight=100.0)
    value, grads = jax.value_and_grad(ours)(params)
    ref_value, ref_grads = jax.value_and_grad(lambda p: formula(plain_of(p), x, noisy, 100.0))(
        params
    )
    assert np.isfinite(value) and all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))
    assert value.dtype == jnp.float64
    np.testing.assert_allclose(value, ref_value, rtol=F64_RTOL)
    for name in params:
        scale = float(np.max(np.abs(ref_grads[name])))  # 1 - tanh² vs jnp's tanh rule
        np.testing.assert_allclose(grads[name], ref_grads[name], rtol=0, atol=F64_RTOL * scale)
    # the exact penalty's nested reverse mode does differentiate the backward
    with pytest.raises(RuntimeError, match="second derivative"):
        jax.grad(
            lambda p: fastgp.gradient_penalty(critic_of(p), x, kind="r1", second_order="reverse")
        )(params)


def test_the_exact_penalty_names_approximate_r1_on_such_a_critic():
    params, x = params_of(), data()
    with pytest.raises(NotImplementedError, match="approximate_r1"):
        jax.grad(
            lambda p: fastgp.gradient_penalty(
                lambda y: apply_critic(p, y, act=custom_tanh), x, kind="r1"
            )
        )(params)


# --- sharding ----------------------------------------------------------------------------------


def single_device(params, x, key):
    loss = lambda p: approximate_r1(lambda y: apply_critic(p, y), x, key, sigma=0.05, weight=100.0)
    return jax.value_and_grad(loss)(params)


def assert_matches(value, grads, ref_value, ref_grads):
    """In float64 (the sharded sums' order differs from one device's)."""
    assert value.dtype == jnp.float64
    np.testing.assert_allclose(value, ref_value, rtol=F64_RTOL)
    for name in ref_grads:
        scale = float(np.max(np.abs(ref_grads[name])))
        np.testing.assert_allclose(grads[name], ref_grads[name], rtol=0, atol=F64_RTOL * scale)


@pytest.mark.parametrize("devices", [2, 4])
@jax.enable_x64(True)
def test_shard_map_equals_single_device_for_the_same_key(devices):
    params, x, key = params_of(), data(batch=4 * devices, dtype=jnp.float64), jax.random.key(9)
    mesh = jax.make_mesh((devices,), ("data",), devices=jax.devices()[:devices])

    def step(params, x, key):
        loss = lambda p: approximate_r1(
            lambda y: apply_critic(p, y), x, key, sigma=0.05, weight=100.0, axis_name="data"
        )
        value, grads = jax.value_and_grad(loss)(params)
        return value[None], jax.tree.map(lambda g: g[None], grads)

    fn = jax.shard_map(
        step, mesh=mesh, in_specs=(P(), P("data"), P()), out_specs=P("data"), check_vma=True
    )
    values, grads = jax.jit(fn)(
        jax.device_put(params, NamedSharding(mesh, P())),
        jax.device_put(x, NamedSharding(mesh, P("data"))),
        key,
    )
    values = np.asarray(values)
    assert np.all(values == values[0]), "shards disagree"
    ref_value, ref_grads = single_device(params, x, key)
    assert_matches(values[0], jax.tree.map(lambda g: np.asarray(g)[0], grads), ref_value, ref_grads)


def test_shard_map_without_axis_name_is_an_error():
    mesh = jax.make_mesh((4,), ("data",), devices=jax.devices()[:4])
    fn = jax.shard_map(
        lambda x: approximate_r1(jnp.tanh, x, jax.random.key(0), sigma=0.1, weight=1.0)[None],
        mesh=mesh,
        in_specs=P("data"),
        out_specs=P("data"),
        check_vma=True,
    )
    x = jax.device_put(jnp.ones((8, 1)), NamedSharding(mesh, P("data")))
    with pytest.raises(ValueError, match="axis_name='data'"):
        fn(x)


@jax.enable_x64(True)
def test_jit_with_named_sharding_equals_single_device():
    params, x, key = params_of(), data(batch=16, dtype=jnp.float64), jax.random.key(9)
    mesh = jax.make_mesh((4,), ("data",), devices=jax.devices()[:4], axis_types=(AxisType.Auto,))
    step = jax.jit(
        single_device,
        in_shardings=(NamedSharding(mesh, P()), NamedSharding(mesh, P("data")), None),
    )
    value, grads = step(params, x, key)
    assert_matches(value, grads, *single_device(params, x, key))


# --- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize("sigma", [0.0, -0.1, float("nan"), float("inf")])
def test_bad_sigma_is_a_value_error(sigma):
    with pytest.raises(ValueError, match="sigma must be finite and > 0"):
        approximate_r1(jnp.tanh, jnp.ones((4, 1)), jax.random.key(0), sigma=sigma, weight=1.0)


def test_bad_arguments_are_named():
    key, x = jax.random.key(0), jnp.ones((4, 3))
    critic = lambda y: jnp.sum(y, axis=1)
    with pytest.raises(TypeError, match="sigma must be a real scalar"):
        approximate_r1(critic, x, key, sigma=cast(Any, "0.1"), weight=1.0)
    with pytest.raises(ValueError, match="weight must be finite"):
        approximate_r1(critic, x, key, sigma=0.1, weight=float("nan"))
    with pytest.raises(ValueError, match=r"weight must be >= 0, got -1.0.*rewards steep gradients"):
        approximate_r1(critic, x, key, sigma=0.1, weight=-1.0)
    with pytest.raises(ValueError, match=r"axis_name='data' names the mesh axis 'data', which no"):
        approximate_r1(critic, x, key, sigma=0.1, weight=1.0, axis_name="data")
    with pytest.raises(ValueError, match=r"inside jax.shard_map\(..., mesh=mesh\) with 'seq'"):
        approximate_r1(critic, x, key, sigma=0.1, weight=1.0, sample_axis_name="seq")
    with pytest.raises(ValueError, match=r"scores of shape \(4,\) or \(4, 1\)"):
        approximate_r1(lambda y: y, x, key, sigma=0.1, weight=1.0)
    with pytest.raises(ValueError, match="every leaf must share the leading batch axis"):
        approximate_r1(critic, {"a": x, "b": jnp.ones((5, 3))}, key, sigma=0.1, weight=1.0)
    with pytest.raises(ValueError, match="scalar"):
        approximate_r1(critic, jnp.float32(1.0), key, sigma=0.1, weight=1.0)
    with pytest.raises(TypeError, match="floating"):
        approximate_r1(critic, jnp.ones((4, 3), jnp.int32), key, sigma=0.1, weight=1.0)
    with pytest.raises(TypeError, match="axis_name"):
        approximate_r1(critic, x, key, sigma=0.1, weight=1.0, axis_name=cast(Any, 3))
    with pytest.raises(TypeError, match="weight"):
        cast(Any, approximate_r1)(critic, x, key, sigma=0.1)  # no default weight


@jax.enable_x64(True)
def test_traced_sigma_and_weight_are_allowed():
    x, key = data(dtype=jnp.float64), jax.random.key(2)
    critic = lambda y: apply_critic(params_of(), y, jnp.float64)
    run = jax.jit(lambda s, w: approximate_r1(critic, x, key, sigma=s, weight=w))
    np.testing.assert_allclose(
        run(0.05, 3.0), approximate_r1(critic, x, key, sigma=0.05, weight=3.0), rtol=F64_RTOL
    )
    # zero is allowed; a traced weight is taken as given (a schedule's value is not checked)
    assert float(approximate_r1(critic, x, key, sigma=0.05, weight=0.0)) == 0.0
    np.testing.assert_allclose(run(0.05, -3.0), -run(0.05, 3.0), rtol=F64_RTOL)
