"""The outside scorer of MNIST samples: a CNN that classifies held-out digits, whose feature
distance orders known damage as its severity, and which refuses too few samples."""

import itertools

import numpy as np
import pytest

from benchmarks.exactness import outside_scorer
from fastgp.train.data.sets import load_mnist, mnist_split


@pytest.fixture(scope="module")
def scorer():
    return outside_scorer.OutsideScorer(seed=0)


def test_the_cnn_classifies_digits_it_never_saw(scorer):
    # trained on the held-out half; the training half is unseen by it
    assert scorer.train_accuracy > 0.93
    assert scorer.held_out_accuracy >= scorer.train_accuracy


def test_damage_scores_in_order_of_its_severity(scorer):
    rows = {r["row"]: r for r in outside_scorer.calibrate(scorer)}
    real = rows["real (the training half)"]["frechet"]
    assert real == pytest.approx(scorer.floor, abs=1e-4)  # the row is rounded to 4 places
    noise = [rows[f"real + noise {s}"]["frechet"] for s in outside_scorer.NOISE_SIGMAS]
    assert real < noise[0] and all(a < b for a, b in itertools.pairwise(noise))
    one = scorer(outside_scorer.calibration_rows(0)["real, one class (3)"])
    # the CNN labels about 9 in 10 of the 3s as 3s (its accuracy on digits it never saw: 0.95)
    assert int(np.argmax(one["histogram"])) == 3 and max(one["histogram"]) > 0.8 * 2000
    assert rows["real, one class (3)"]["frechet"] > 10 * real
    assert rows["real + noise 0.1"]["classes"] == 10


def test_a_generator_of_copies_scores_near_the_floor_and_flat_images_far(scorer):
    train_rows, _ = mnist_split(0)
    images = load_mnist()[train_rows]
    rng = np.random.default_rng(1)
    copies = images[rng.integers(0, len(images), 2000)]
    flat = np.full((1000, 28, 28, 1), -1.0, np.float32)
    assert scorer(copies)["frechet"] < 2 * scorer.floor
    assert scorer(flat)["frechet"] > 100 * scorer.floor


def test_too_few_samples_is_an_error_naming_the_count(scorer):
    with pytest.raises(ValueError, match="at least 1000 samples, got 10"):
        scorer(np.zeros((10, 28, 28, 1), np.float32))
