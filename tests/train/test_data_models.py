"""Toy data, models and the mode-quality metric: distributional and structural properties."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastgp.penalty import gradient_penalty, interpolate
from fastgp.train.data.quality import mode_quality
from fastgp.train.data.sets import CHECK_DATASETS, DATASETS, load_digits, sample_toy, toy_modes
from fastgp.train.models.networks import conv_critic, conv_generator, mlp
from fastgp.train.recipes.defaults import RECIPES, default_config

# P(|N(0, I_2)| <= 3): the 3-sigma Euclidean disk holds 98.9 % of a 2-D Gaussian (99.7 % is 1-D).
P_3SIGMA_2D = 1.0 - math.exp(-4.5)
MIXTURES = ("8gaussians", "25gaussians")


@pytest.mark.parametrize("name", MIXTURES)
def test_mixture_points_sit_on_their_modes(name):
    n = 20_000
    x = np.asarray(sample_toy(name, jax.random.key(0), n))
    assert x.shape == (n, 2) and x.dtype == np.float32
    centers, sigma = toy_modes(name)
    dist = np.linalg.norm(x[:, None] - centers[None], axis=-1)
    nearest = dist.argmin(1)
    inside = dist.min(1) <= 3 * sigma
    assert abs(inside.mean() - P_3SIGMA_2D) < 0.005
    counts = np.bincount(nearest, minlength=len(centers))
    expected = n / len(centers)
    # Uniform choice of center: every count within 5 binomial standard deviations.
    assert np.all(np.abs(counts - expected) < 5 * math.sqrt(expected))
    # Per-axis spread around the assigned center is sigma.
    resid = x - centers[nearest]
    np.testing.assert_allclose(resid.std(0), sigma, rtol=0.03)


def test_mode_geometry_matches_gan_toy():
    c8, s8 = toy_modes("8gaussians")
    np.testing.assert_allclose(np.linalg.norm(c8, axis=1), 2 / 1.414, rtol=1e-6)
    assert s8 == pytest.approx(0.02 / 1.414)
    c25, s25 = toy_modes("25gaussians")
    assert c25.shape == (25, 2) and c25.dtype == np.float32
    np.testing.assert_allclose(np.unique(c25[:, 0]), np.arange(-4, 5, 2) / 2.828, rtol=1e-6)
    assert s25 == pytest.approx(0.05 / 2.828)


def test_swissroll_matches_sklearn_in_distribution():
    from sklearn.datasets import make_swiss_roll

    n = 20_000
    ours = np.asarray(sample_toy("swissroll", jax.random.key(1), n))
    ref = make_swiss_roll(n, noise=0.25, random_state=0)[0][:, [0, 2]] / 7.5
    r_ours, r_ref = np.linalg.norm(ours, axis=1), np.linalg.norm(ref, axis=1)
    # Noise-free radius is t / 7.5 with t in [1.5 pi, 4.5 pi]; the noise is 0.25 / 7.5 per axis.
    lo, hi, noise = 1.5 * np.pi / 7.5, 4.5 * np.pi / 7.5, 0.25 / 7.5
    assert lo - 5 * noise < r_ours.min() < lo + noise
    assert hi - noise < r_ours.max() < hi + 5 * noise
    qs = np.linspace(0.01, 0.99, 15)
    np.testing.assert_allclose(np.quantile(r_ours, qs), np.quantile(r_ref, qs), atol=0.02)
    np.testing.assert_allclose(ours.mean(0), ref.mean(0), atol=0.02)


@pytest.mark.parametrize("name", DATASETS[:3])
def test_sampling_is_key_driven_and_jittable(name):
    f = jax.jit(sample_toy, static_argnums=(0, 2))
    a = f(name, jax.random.key(3), 64)
    np.testing.assert_allclose(a, sample_toy(name, jax.random.key(3), 64), rtol=1e-6, atol=1e-6)
    assert not np.array_equal(a, f(name, jax.random.key(4), 64))


def test_unknown_names_raise():
    with pytest.raises(ValueError, match="8gaussians"):
        sample_toy("moons", jax.random.key(0), 4)
    with pytest.raises(ValueError, match="swissroll"):
        toy_modes("swissroll")
    with pytest.raises(ValueError, match="moons"):
        toy_modes("moons")
    with pytest.raises(ValueError, match="swish"):
        mlp([2, 8, 1], activation="swish")
    with pytest.raises(ValueError, match=r"\(2,\)"):
        mlp([2])
    with pytest.raises(ValueError, match="swish"):
        conv_critic(8, activation="swish")
    with pytest.raises(ValueError, match="unknown dataset 'moons'; valid names: 8gaussians"):
        default_config("moons")


def test_every_dataset_has_a_recipe_and_the_checked_ones_exist():
    assert tuple(RECIPES) == DATASETS
    assert set(CHECK_DATASETS) <= set(DATASETS)


def test_digits():
    d = load_digits()
    assert d.shape == (1797, 8, 8, 1) and d.dtype == np.float32  # NHWC
    assert d.min() == -1.0 and d.max() == 1.0
    from sklearn.datasets import load_digits as sk_digits

    np.testing.assert_array_equal(d[..., 0], sk_digits().images / 8.0 - 1.0)  # rows, then columns


def test_mode_quality_of_real_data_and_collapsed_and_noise():
    centers, sigma = toy_modes("25gaussians")
    real = np.asarray(sample_toy("25gaussians", jax.random.key(5), 2500))
    q = mode_quality(real, centers, sigma)
    assert q["modes"] == q["total_modes"] == 25
    assert abs(q["high_quality"] - 100 * P_3SIGMA_2D) < 1.0

    collapsed = np.repeat(centers[7:8], 2500, axis=0)
    assert mode_quality(collapsed, centers, sigma) == {
        "modes": 1,
        "high_quality": 100.0,
        "total_modes": 25,
    }

    uniform = np.random.default_rng(0).uniform(-2, 2, (2500, 2))
    # 25 disks of radius 3 sigma cover about 1.4 % of the square.
    assert mode_quality(uniform, centers, sigma)["high_quality"] < 4.0


def test_mode_quality_boundary_and_non_finite():
    centers = np.array([[0.0, 0.0], [10.0, 0.0]])
    pts = np.array([[0.299, 0.0], [0.301, 0.0], [np.nan, 0.0], [10.0, 0.0]])
    q = mode_quality(pts, centers, 0.1)
    assert q["modes"] == 2 and q["high_quality"] == 50.0
    with pytest.raises(ValueError, match="sigma"):
        mode_quality(pts, centers, 0.0)
    with pytest.raises(ValueError, match="same d"):
        mode_quality(pts, np.zeros((2, 3)), 0.1)


def test_mlp_shapes_and_bf16_close_to_f32():
    critic, gen = mlp([2, 128, 128, 1]), mlp([2, 64, 64, 2], activation="leaky_relu")

    @jax.jit
    def outputs(key):
        x = jax.random.normal(key, (256, 2))
        return [
            (m.apply(m.init(key), x), m.apply(m.init(key), x, dtype=jnp.bfloat16))
            for m in (critic, gen)
        ]

    for (f32, bf16), shape in zip(outputs(jax.random.key(0)), ((256,), (256, 2)), strict=True):
        assert f32.shape == bf16.shape == shape and bf16.dtype == jnp.float32
        err = float(jnp.linalg.norm(bf16 - f32) / jnp.linalg.norm(f32))
        assert 0 < err < 0.03
    params = jax.eval_shape(critic.init, jax.random.key(0))
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(params))


def test_mlp_he_init_keeps_activation_scale():
    p = jax.jit(mlp([64, 512, 512, 512, 1]).init)(jax.random.key(0))

    @jax.jit
    def hidden(p, h):
        for layer in p[:-1]:
            h = jax.nn.relu(h @ layer["w"] + layer["b"])
        return h

    h = hidden(p, jax.random.normal(jax.random.key(1), (1024, 64)))
    # He init preserves the second moment of ReLU activations: E[h^2] stays near E[x^2] / 2 * 2 = 1.
    assert 0.6 < float(jnp.mean(h**2)) < 1.6


def _block_maxima(fn, x, jac):
    """Max |d out_i / d x_j| over i == j and over i != j (per-sample independence check)."""
    b = x.shape[0]
    j = jnp.abs(jac(fn)(x).reshape(b, -1, b, math.prod(x.shape[1:])))  # (B, out, B, in)
    eye = jnp.eye(b, dtype=bool)[:, None, :, None]
    return jnp.where(eye, j, 0).max(), jnp.where(eye, 0, j).max()


def test_conv_models_are_per_sample():
    critic, gen = conv_critic(8), conv_generator(16, channels=8)

    @jax.jit  # one program: separate eager inits and applies would each compile on their own
    def check(key, x):
        k1, k2, k3 = jax.random.split(key, 3)
        pc, pg = critic.init(k1), gen.init(k2)
        z = jax.random.normal(k3, (x.shape[0], 16))
        img = gen.apply(pg, z)
        return (
            critic.apply(pc, x),
            img,
            _block_maxima(lambda v: critic.apply(pc, v), x, jax.jacrev),
            _block_maxima(lambda v: gen.apply(pg, v), z, jax.jacfwd),
        )

    scores, img, (c_diag, c_off), (g_diag, g_off) = check(jax.random.key(0), load_digits()[:4])
    assert scores.shape == (4,) and img.shape == (4, 8, 8, 1)
    assert float(jnp.abs(img).max()) <= 1.0
    assert c_diag > 0 and c_off == 0
    assert g_diag > 0 and g_off == 0


def test_conv_critic_bf16_and_penalty_gradients_are_finite():
    critic = conv_critic()

    @jax.jit
    def check(key, real):
        k1, k2, k3 = jax.random.split(key, 3)
        p = critic.init(k1)
        fake = jax.random.uniform(k2, real.shape, minval=-1, maxval=1)
        x_hat = interpolate(k3, real, fake)
        loss = lambda q: gradient_penalty(lambda v: critic.apply(q, v), x_hat, backend="xla")
        return critic.apply(p, real), critic.apply(p, real, dtype=jnp.bfloat16), jax.grad(loss)(p)

    f32, bf16, grads = check(jax.random.key(0), load_digits()[:8])
    assert float(jnp.linalg.norm(bf16 - f32) / jnp.linalg.norm(f32)) < 0.03
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))
    assert any(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(grads))


def test_conv_generator_outputs_and_bf16():
    """Clipped (default) and tanh outputs stay in [-1, 1]; clipping reaches the data's exact -1
    background; bfloat16 is close to float32; an unknown output is refused by name."""
    with pytest.raises(ValueError, match="sigmoid"):
        conv_generator(8, 4, output="sigmoid")

    @jax.jit
    def outputs(key):
        k1, k2 = jax.random.split(key)
        z = jax.random.normal(k2, (64, 16))
        result = {}
        for output in ("clip", "tanh"):
            gen = conv_generator(16, 8, output=output)
            p = gen.init(k1)
            result[output] = (gen.apply(p, z), gen.apply(p, z, dtype=jnp.bfloat16))
        return result

    for output, (f32, bf16) in outputs(jax.random.key(0)).items():
        assert f32.shape == bf16.shape == (64, 8, 8, 1) and bf16.dtype == jnp.float32
        assert float(jnp.abs(f32).max()) <= 1.0 and float(jnp.abs(bf16).max()) <= 1.0
        assert float(jnp.linalg.norm(bf16 - f32) / jnp.linalg.norm(f32)) < 0.05, output
        assert bool(jnp.any(f32 == -1.0)) is (output == "clip")
