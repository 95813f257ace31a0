"""The digits metric: real digits score at the real-vs-real floor; collapse and noise do not."""

import numpy as np
import pytest

from fastgp.train.data import load_digits
from fastgp.train.digit_quality import DigitQuality


@pytest.fixture(scope="module")
def metric():
    return DigitQuality()


def _draw(images, n, seed):
    return images[np.random.default_rng(seed).integers(0, len(images), n)]


def test_real_digits_score_at_the_floor(metric):
    assert 0.45 < metric.floor < 0.55
    # Real digits the reference half never saw, through the trainer's data pipeline (NHWC).
    real = load_digits()[metric.train_index]
    real = real[np.random.default_rng(0).permutation(len(real))]
    q = metric(real)
    assert abs(q["c2st_accuracy"] - q["c2st_floor"]) < 0.03
    assert q["c2st_samples"] == metric.n_samples == 898
    assert q["classes_covered"] == 10 and q["class_entropy"] > 0.99
    assert sum(q["class_histogram"]) == len(real)


def test_one_class_is_far_from_the_floor(metric):
    threes = load_digits()[metric.train_index][metric.classifier.predict(metric.train_images) == 3]
    q = metric(_draw(threes, 1000, 1))
    assert q["c2st_accuracy"] > 0.9
    assert q["classes_covered"] == 1 and q["class_entropy"] < 0.1
    assert np.argmax(q["class_histogram"]) == 3


def test_noise_and_blur_are_far_from_the_floor(metric):
    rng = np.random.default_rng(2)
    noise = metric(rng.uniform(-1, 1, (1000, 8, 8, 1)))
    assert noise["c2st_accuracy"] > 0.98
    real = metric.train_images
    blurred = metric(0.7 * _draw(real, 1000, 3) + 0.3 * real.mean(0))  # every class, washed out
    assert blurred["classes_covered"] == 10 and blurred["c2st_accuracy"] > 0.95


def test_deterministic_and_clear_errors(metric):
    samples = np.random.default_rng(4).uniform(-1, 1, (900, 64))
    assert metric(samples) == metric(samples)
    assert DigitQuality(seed=0).floor == metric.floor
    with pytest.raises(ValueError, match="at least 898 samples"):
        metric(samples[:100])
    with pytest.raises(ValueError, match=r"\(N, 8, 8, 1\)"):
        metric(np.zeros((900, 3, 8, 8)))
    samples[5, 3] = np.nan
    with pytest.raises(ValueError, match="1 of 900 samples are not finite"):
        metric(samples)


def test_runs_train_on_the_first_half_only(metric):
    """``load_digits(split=...)`` are the metric's halves, and the digits recipe samples only the
    first: the two-sample test's reference is held out from training."""
    import jax

    from fastgp.train.data import digit_split
    from fastgp.train.recipes import build_problem, default_config

    train, held_out = digit_split()
    np.testing.assert_array_equal(metric.train_index, train)
    np.testing.assert_array_equal(metric.held_out_index, held_out)
    assert len(train) == 899 and len(held_out) == 898 and not set(train) & set(held_out)
    np.testing.assert_array_equal(load_digits(split="train").reshape(-1, 64), metric.train_images)
    np.testing.assert_array_equal(load_digits(split="held_out").reshape(-1, 64), metric.held_out)
    problem = build_problem("digits", default_config("digits"))
    drawn = np.asarray(problem.sample_real(jax.random.PRNGKey(0), 512)).reshape(-1, 64)
    first = {row.tobytes() for row in metric.train_images}
    assert all(row.tobytes() in first for row in drawn)
    with pytest.raises(ValueError, match="unknown digits split 'test'"):
        load_digits(split="test")
