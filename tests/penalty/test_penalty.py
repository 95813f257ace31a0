"""Public penalty API: published values, the naive path, second and third order, NaN safety.

Exactness against the naive path is asserted in float64 on XLA (``F64_RTOL``); the kernels
accumulate in float32 (float64 is refused), so their runs stay float32 at bounds that say why.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastgp import penalty
from fastgp._penalty import reference
from oracles import norms64, penalties64

BACKENDS = ["xla", "interpret", "tpu-interpret", "auto"]
KINDS = ["wgan-gp", "wgan-lp", "r1"]
# float64 rounding: XLA's penalty and its derivatives agree with nested autodiff to ~1e-15 of the
# largest entry here; 1e-12 leaves 100x (float32 gives ~1e-7, and differs between CPUs).
F64_RTOL = 1e-12


def linear_critic(x):
    return 2.0 * jnp.sum(x, axis=1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_tf_gan_published_values(backend):
    """TF-GAN's tests: D(x) = 2x on one sample of 4 features, so n = 4."""
    x = jnp.ones((1, 4))
    gp = lambda **kw: float(penalty.gradient_penalty(linear_critic, x, backend=backend, **kw))
    assert gp(weight=1.0) == pytest.approx(9.0, rel=1e-6)
    assert gp(weight=1.0, target=2.0) == pytest.approx(1.0, rel=1e-6)
    assert gp(weight=1.0, kind="wgan-lp") == pytest.approx(9.0, rel=1e-6)
    assert gp(weight=2.3) == pytest.approx(20.7, rel=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_sided_penalty_is_zero_below_the_target_and_two_sided_is_not(backend):
    """n = 0.5 with t = 1: wgan-gp gives (0.5 - 1)^2 = 0.25 and pulls the norm up; wgan-lp gives
    0 and no gradient. Above the target (n = 3) both give (3 - 1)^2 = 4."""
    below, above = jnp.full((2, 4), 0.25), jnp.full((2, 4), 1.5)  # norms 0.5 and 3
    for grads, gp, lp in ((below, 0.25, 0.0), (above, 4.0, 4.0)):
        value = lambda g, kind: penalty.penalty_from_grads(
            g, kind=kind, weight=1.0, backend=backend
        )
        assert float(value(grads, "wgan-gp")) == pytest.approx(gp, rel=1e-6)
        assert float(value(grads, "wgan-lp")) == pytest.approx(lp, rel=1e-6, abs=1e-12)
    d_gp = jax.grad(lambda g: penalty.penalty_from_grads(g, weight=1.0, backend=backend))(below)
    d_lp = jax.grad(lambda g: penalty.penalty_from_grads(g, kind="wgan-lp", backend=backend))(below)
    # d/dg mean_b (n_b - 1)^2 = 2 (n_b - 1) g_b / (n_b B) = 2 * -0.5 * 0.25 / (0.5 * 2) = -0.25
    np.testing.assert_allclose(d_gp, np.full((2, 4), -0.25), rtol=1e-6)
    assert not np.any(np.asarray(d_lp))


def mlp_critic(params, x):
    """Per-sample tanh MLP on (B, ...) inputs, any pytree of leaves."""
    leaves = jax.tree.leaves(x)
    batch = leaves[0].shape[0]
    dtype = params["w1"].dtype  # float32 (bf16 inputs are widened), float64 under x64
    flat = jnp.concatenate([leaf.reshape(batch, -1).astype(dtype) for leaf in leaves], 1)
    hidden = jnp.tanh(flat @ params["w1"] + params["b1"])
    return (hidden @ params["w2"])[:, 0]


def make_problem(seed, shapes, dtype=jnp.float32, scale=1.0):
    keys = jax.random.split(jax.random.PRNGKey(seed), len(shapes) + 2)
    x = {
        f"x{i}": jax.random.normal(k, s, dtype)
        for i, (k, s) in enumerate(zip(keys, shapes, strict=False))
    }
    features = sum(int(np.prod(s[1:])) for s in shapes)
    params = {
        "w1": scale * jax.random.normal(keys[-2], (features, 16)) / np.sqrt(features),
        "b1": jnp.zeros(16),
        "w2": jax.random.normal(keys[-1], (16, 1)),
    }
    return params, x


def on_xla_in_float64(backend):
    """x64 on for XLA, whose exactness is asserted in float64; off for the float32 kernels."""
    return jax.enable_x64(backend == "xla")


@pytest.mark.parametrize("backend", ["xla", "tpu-interpret"])
def test_third_order_through_the_penalty_matches_naive(backend):
    """grad of |d penalty / d params|^2: differentiates the penalty's backward kernel. The kernel
    in float32: 1.1e-7 of the largest entry measured on AVX-512, AVX2 and SSE4.2 (a one-layer
    MLP's third-order program); 1e-5 leaves 100x."""
    with on_xla_in_float64(backend):
        dtype = jnp.float64 if backend == "xla" else jnp.float32
        params, x = make_problem(1, [(5, 9)], dtype, scale=2.0)

        def grad_norm_sq(fn):
            return lambda p: sum(jnp.sum(g**2) for g in jax.tree.leaves(jax.grad(fn)(p)))

        ours = lambda p: penalty.gradient_penalty(lambda y: mlp_critic(p, y), x, backend=backend)
        naive = lambda p: reference.naive_gradient_penalty(lambda y: mlp_critic(p, y), x)
        third = jax.grad(grad_norm_sq(ours))(params)
        third_ref = jax.grad(grad_norm_sq(naive))(params)
    tolerance = 10 * F64_RTOL if backend == "xla" else 1e-5
    for name in params:
        scale = float(np.max(np.abs(third_ref[name])))
        assert scale > 0
        np.testing.assert_allclose(third[name], third_ref[name], rtol=0, atol=tolerance * scale)


@pytest.mark.parametrize("backend", ["xla", "interpret"])
def test_reverse_over_reverse_hessian_matches_naive(backend):
    """The kernel in float32: 3e-7 measured (the Hessian of 7-element rows' penalty)."""
    with on_xla_in_float64(backend):
        g = jax.random.normal(jax.random.PRNGKey(2), (4, 7), jnp.float32)
        g = g.astype(jnp.float64) if backend == "xla" else g
        ours = jax.jacrev(jax.jacrev(lambda g: penalty.penalty_from_grads(g, backend=backend)))(g)
        naive = jax.hessian(lambda g: reference.naive_penalty_from_grads(g))(g)
    rtol, atol = (F64_RTOL, F64_RTOL) if backend == "xla" else (1e-5, 1e-6)
    np.testing.assert_allclose(ours, naive, rtol=rtol, atol=atol)


@pytest.mark.parametrize("backend", ["xla", "interpret"])
def test_forward_mode_of_the_penalty_from_gradients_equals_naive(backend):
    """The kernel in float32: a sum of 28 products, 1e-6 is 8 float32 steps."""
    with on_xla_in_float64(backend):
        g, t = (jax.random.normal(jax.random.PRNGKey(i), (4, 7), jnp.float32) for i in (2, 3))
        if backend == "xla":
            g, t = g.astype(jnp.float64), t.astype(jnp.float64)
        _, ours = jax.jvp(lambda g: penalty.penalty_from_grads(g, backend=backend), (g,), (t,))
        _, naive = jax.jvp(lambda g: reference.naive_penalty_from_grads(g), (g,), (t,))
    np.testing.assert_allclose(ours, naive, rtol=F64_RTOL if backend == "xla" else 1e-6)


@given(
    shapes=st.lists(st.tuples(st.integers(1, 4), st.integers(1, 140)), min_size=1, max_size=3),
    batch=st.integers(1, 40),
    kind=st.sampled_from(KINDS),
    dtype=st.sampled_from(["float32", "bfloat16"]),
    backend=st.sampled_from(["xla", "interpret", "tpu-interpret"]),
    seed=st.integers(0, 999),
)
def test_pytree_norms_and_penalty_match_float64(shapes, batch, kind, dtype, backend, seed):
    """Float32 accumulation (XLA's and the kernels') of up to 560 squares against float64 numpy:
    1.1e-7 of each norm at most, the same on AVX-512, AVX2 and SSE4.2; 1e-6 leaves 9x."""
    keys = jax.random.split(jax.random.PRNGKey(seed), len(shapes))
    grads = [
        jax.random.normal(k, (batch,) + s, jnp.dtype(dtype))
        for k, s in zip(keys, shapes, strict=True)
    ]
    leaves64 = [np.asarray(g.astype(jnp.float32)) for g in grads]
    n64 = norms64(leaves64)
    np.testing.assert_allclose(penalty.grad_norms(grads, backend=backend), n64, rtol=1e-6)
    value = penalty.penalty_from_grads(grads, kind=kind, target=2.0, weight=3.0, backend=backend)
    np.testing.assert_allclose(
        value, 3.0 * np.mean(penalties64(n64, kind, 2.0)), rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_input_gradient_gives_finite_parameter_gradients(backend):
    """A dead ReLU critic: zero input-gradient for every sample."""
    params = {"w": -jnp.ones((3, 4)), "v": jnp.ones((4,))}
    x = jnp.abs(jax.random.normal(jax.random.PRNGKey(0), (5, 3)))
    critic = lambda p, y: jax.nn.relu(y @ p["w"]) @ p["v"]
    for kind in KINDS:
        # Called at once, in this iteration: the late binding of kind is not an issue.
        fn = lambda p: penalty.gradient_penalty(
            lambda y: critic(p, y),
            x,
            kind=kind,  # type: ignore[arg-type]  # noqa: B023
            target=0.1,
            backend=backend,
        )
        value, grads = jax.value_and_grad(fn)(params)
        expected = 10.0 if kind == "wgan-gp" else 0.0  # (0/t - 1)^2 = 1, weight 10
        assert float(value) == pytest.approx(expected)
        assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))
    naive = jax.grad(lambda p: reference.naive_gradient_penalty(lambda y: critic(p, y), x))(params)
    assert not bool(jnp.all(jnp.isfinite(naive["w"]))), "the naive path is expected to give NaN"


def test_one_zero_sample_does_not_poison_the_others():
    g = jax.random.normal(jax.random.PRNGKey(3), (4, 6)).at[2].set(0.0)
    ours = jax.grad(lambda g: penalty.penalty_from_grads(g, backend="interpret"))(g)
    naive = jax.grad(lambda g: reference.naive_penalty_from_grads(g))(g)
    assert bool(jnp.all(ours[2] == 0))
    np.testing.assert_allclose(np.delete(ours, 2, 0), np.delete(naive, 2, 0), rtol=1e-5)


def test_norm_is_per_sample_not_per_batch():
    g = jnp.stack([jnp.full((3, 4), 1.0), jnp.full((3, 4), 2.0)])
    np.testing.assert_allclose(
        penalty.grad_norms(g, backend="xla"), [np.sqrt(12), np.sqrt(48)], rtol=1e-6
    )


def test_bf16_gradients_give_float32_results_and_cotangents():
    g = jax.random.normal(jax.random.PRNGKey(4), (8, 300), jnp.bfloat16)
    value, dg = jax.value_and_grad(lambda g: penalty.penalty_from_grads(g, backend="interpret"))(g)
    assert value.dtype == jnp.float32 and dg.dtype == jnp.bfloat16
    ref = jax.grad(lambda g: reference.naive_penalty_from_grads(g))(g.astype(jnp.float32))
    np.testing.assert_allclose(dg.astype(jnp.float32), ref, rtol=2**-7, atol=1e-6)


def test_interpolate_draws_one_uniform_alpha_per_sample():
    batch = 4096
    real = {"img": jnp.zeros((batch, 3, 2, 2)), "label": jnp.zeros((batch, 5))}
    fake = {"img": jnp.ones((batch, 3, 2, 2)), "label": 2 * jnp.ones((batch, 5))}
    mixed = penalty.interpolate(jax.random.PRNGKey(0), real, fake)
    alpha = np.asarray(mixed["img"][:, 0, 0, 0])
    assert np.all(mixed["img"] == alpha[:, None, None, None]), "alpha must be shared per sample"
    np.testing.assert_allclose(mixed["label"], 2 * alpha[:, None] * np.ones((1, 5)), rtol=1e-6)
    assert 0.0 <= alpha.min() and alpha.max() <= 1.0
    hist, _ = np.histogram(alpha, bins=8, range=(0, 1))
    assert np.all(np.abs(hist / batch - 1 / 8) < 0.03), "alpha must be U[0, 1]"
    assert len(np.unique(alpha)) > batch * 0.99, "alpha must differ between samples"


def test_interpolate_keeps_dtype():
    real = jnp.zeros((3, 5), jnp.bfloat16)
    out = penalty.interpolate(jax.random.PRNGKey(0), real, jnp.ones_like(real))
    assert out.dtype == jnp.bfloat16 and out.shape == (3, 5)


def test_critic_scores_of_shape_b_by_1_equal_shape_b():
    params, x = make_problem(5, [(4, 6)])
    flat = lambda p: penalty.gradient_penalty(lambda y: mlp_critic(p, y), x, backend="xla")
    column = lambda p: penalty.gradient_penalty(
        lambda y: mlp_critic(p, y)[:, None], x, backend="xla"
    )
    np.testing.assert_array_equal(flat(params), column(params))
    for a, b in zip(
        jax.tree.leaves(jax.grad(flat)(params)),
        jax.tree.leaves(jax.grad(column)(params)),
        strict=True,
    ):
        np.testing.assert_array_equal(a, b)


def test_sum_reduced_penalty_is_the_mean_at_weight_times_batch():
    """The identity the lambda-vs-batch sweep runs the sum-reduction bug by: lambda * sum_b p_b,
    written out with nested autodiff, equals ``gradient_penalty`` with weight lambda * B in value
    and parameter gradients."""
    with jax.enable_x64(True):
        params, x = make_problem(3, [(12, 7)], jnp.float64, scale=3.0)
        batch, lam = 12, 0.7

        def summed(p):
            critic = lambda xi: mlp_critic(p, {"x0": xi[None]})[0]
            per_sample = jax.vmap(jax.grad(critic))(x["x0"])
            norms = jnp.sqrt(jnp.sum(per_sample**2, axis=1))
            return lam * jnp.sum((norms - 1.0) ** 2)

        ours = lambda p: penalty.gradient_penalty(lambda y: mlp_critic(p, y), x, weight=lam * batch)
        value, grads = jax.value_and_grad(ours)(params)
        value_ref, grads_ref = jax.value_and_grad(summed)(params)
    np.testing.assert_allclose(value, value_ref, rtol=F64_RTOL)
    for name in params:
        scale = float(np.max(np.abs(grads_ref[name])))
        np.testing.assert_allclose(grads[name], grads_ref[name], rtol=0, atol=F64_RTOL * scale)
