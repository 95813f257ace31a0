"""A second scorer of MNIST samples, independent of the trainer's metric: the Fréchet distance in
the features of a LeNet-5-shaped CNN, and the classes that CNN sees.

    OutsideScorer(seed=0)            trains the CNN on the held-out half (about 30 s on 2 cores)
    scorer(samples)                  -> {"frechet", "frechet_floor", "classes", "histogram"}
    calibrate(scorer)                -> [{"row", "frechet", "classes"}], the rows below
    python -m benchmarks.exactness.outside_scorer [--json PATH] [--score RUN_DIR ...]
        -> PATH and its page beside it (.md)

The trainer's metric (``fastgp.train.data.quality``) measures the Fréchet distance in the hidden
layer of a one-layer MLP on raw pixels. This one shares nothing with it but the data split: a
convolutional classifier (5x5 conv 6 -> 2x2 mean pool -> 5x5 conv 16 -> pool -> 120 -> 84 -> 10,
ReLU; LeNet-5's shape), trained here in JAX with Adam on the held-out half (2,500 digits) for a
fixed number of epochs, and the Fréchet distance between Gaussians fitted to its 84 penultimate
features of each set of ``SET_SIZE`` samples and of the whole held-out half (FID's recipe with
this CNN in place of Inception). ``frechet`` is the mean over every whole set given. A run trains
on the other half, so its samples and the floor (that half's own sets) are equally unseen by the
CNN. ``classes`` counts the classes holding at least 2.5 % of the samples by the CNN's labels.

Its calibration (``calibrate``) scores the training half itself and known degradations of it:
clipped Gaussian pixel noise of sigma 0.1 to 1.6, a 3x3 box blur, one class alone, uniform noise;
so that every score a run reaches maps to a known level of damage.
"""

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import records
from fastgp.train.data.quality import frechet
from fastgp.train.data.sets import MNIST_SHAPE, load_mnist, mnist_labels, mnist_split

SET_SIZE = 1000
EPOCHS = 8
BATCH = 50
LEARNING_RATE = 2e-3
NOISE_SIGMAS = (0.1, 0.2, 0.4, 0.8, 1.6)
COVERED = 0.025  # a class is covered when it holds at least this share of the samples


def _init(key: jax.Array) -> dict[str, Any]:
    """LeNet-5-shaped parameters (He-normal weights, zero biases)."""
    shapes = {
        "conv1": (5, 5, 1, 6),
        "conv2": (5, 5, 6, 16),
        "fc1": (7 * 7 * 16, 120),
        "fc2": (120, 84),
        "out": (84, 10),
    }
    keys = jax.random.split(key, len(shapes))
    params = {}
    for k, (name, shape) in zip(keys, shapes.items(), strict=True):
        fan_in = math.prod(shape[:-1])
        w = math.sqrt(2.0 / fan_in) * jax.random.normal(k, shape, jnp.float32)
        params[name] = {"w": w, "b": jnp.zeros((shape[-1],), jnp.float32)}
    return params


def _pool(h: jax.Array) -> jax.Array:
    """2x2 mean pooling of NHWC ``h``."""
    b, height, width, c = h.shape
    return h.reshape(b, height // 2, 2, width // 2, 2, c).mean((2, 4))


def _features(params: dict[str, Any], x: jax.Array) -> jax.Array:
    """(B, 28, 28, 1) images in [-1, 1] -> (B, 84) penultimate ReLU features."""
    h = x
    for name in ("conv1", "conv2"):
        h = jax.lax.conv_general_dilated(
            h, params[name]["w"], (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )
        h = _pool(jax.nn.relu(h + params[name]["b"]))
    h = jax.nn.relu(h.reshape(h.shape[0], -1) @ params["fc1"]["w"] + params["fc1"]["b"])
    return jax.nn.relu(h @ params["fc2"]["w"] + params["fc2"]["b"])


def _logits(params: dict[str, Any], x: jax.Array) -> jax.Array:
    return _features(params, x) @ params["out"]["w"] + params["out"]["b"]


def train_classifier(images: np.ndarray, labels: np.ndarray, seed: int = 0) -> dict[str, Any]:
    """The CNN fitted to ``images`` (N, 28, 28, 1) and their int ``labels`` (N,): Adam at
    ``LEARNING_RATE``, ``EPOCHS`` passes in batches of ``BATCH``, shuffled by ``seed``."""
    key = jax.random.PRNGKey(seed)
    params = _init(key)
    moments = jax.tree.map(lambda p: (jnp.zeros_like(p), jnp.zeros_like(p)), params)

    def loss(p: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(_logits(p, x)), y[:, None], 1))

    @jax.jit
    def step(p: Any, m: Any, t: jax.Array, x: jax.Array, y: jax.Array) -> tuple[Any, Any]:
        g = jax.grad(loss)(p, x, y)
        b1, b2 = 0.9, 0.999
        m = jax.tree.map(
            lambda mv, gi: (b1 * mv[0] + (1 - b1) * gi, b2 * mv[1] + (1 - b2) * gi**2),
            m,
            g,
            is_leaf=lambda v: isinstance(v, tuple),
        )
        scale = LEARNING_RATE * jnp.sqrt(1 - b2**t) / (1 - b1**t)
        p = jax.tree.map(
            lambda pi, mv: pi - scale * mv[0] / (jnp.sqrt(mv[1]) + 1e-8),
            p,
            m,
            is_leaf=lambda v: isinstance(v, tuple),
        )
        return p, m

    rng = np.random.default_rng(seed)
    x_all, y_all = jnp.asarray(images, jnp.float32), jnp.asarray(labels, jnp.int32)
    t = 0
    for _ in range(EPOCHS):
        order = rng.permutation(len(images))
        for start in range(0, len(order) - BATCH + 1, BATCH):
            idx = order[start : start + BATCH]
            t += 1
            params, moments = step(params, moments, jnp.float32(t), x_all[idx], y_all[idx])
    return params


class OutsideScorer:
    """The CNN trained on MNIST's held-out half (``mnist_split(seed)``), with that half's feature
    statistics as the reference. ``scorer(samples)`` takes (N, 28, 28, 1) or (N, 784) samples in
    [-1, 1] with N >= ``SET_SIZE``; ValueError for fewer."""

    def __init__(self, seed: int = 0):
        train_rows, held_rows = mnist_split(seed)
        images, labels = load_mnist(), mnist_labels()
        self.params = train_classifier(images[held_rows], labels[held_rows], seed)
        self._embed = jax.jit(lambda x: (_features(self.params, x), _logits(self.params, x)))
        self.reference, held_logits = self.embed(images[held_rows])
        self.held_out_accuracy = float(np.mean(held_logits.argmax(1) == labels[held_rows]))
        train_features, train_logits = self.embed(images[train_rows])
        self.train_accuracy = float(np.mean(train_logits.argmax(1) == labels[train_rows]))
        self.floor = float(np.mean(self._set_distances(train_features)))

    def embed(self, samples: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(features (N, 84), logits (N, 10)) as float64 numpy."""
        x = np.asarray(samples, np.float32).reshape((-1,) + MNIST_SHAPE)
        parts = [self._embed(jnp.asarray(x[i : i + 500])) for i in range(0, len(x), 500)]
        features = np.concatenate([np.asarray(p[0], np.float64) for p in parts])
        logits = np.concatenate([np.asarray(p[1], np.float64) for p in parts])
        return features, logits

    def _set_distances(self, features: np.ndarray) -> list[float]:
        sets = len(features) // SET_SIZE
        return [
            frechet(features[i * SET_SIZE : (i + 1) * SET_SIZE], self.reference)
            for i in range(sets)
        ]

    def __call__(self, samples: np.ndarray) -> dict[str, Any]:
        if len(samples) < SET_SIZE:
            raise ValueError(
                f"the outside scorer needs at least {SET_SIZE} samples, got {len(samples)}"
            )
        features, logits = self.embed(samples)
        histogram = np.bincount(logits.argmax(1), minlength=10)
        return {
            "frechet": round(float(np.mean(self._set_distances(features))), 4),
            "frechet_floor": round(self.floor, 4),
            "classes": int(np.sum(histogram >= COVERED * len(samples))),
            "histogram": histogram.tolist(),
        }


def _blurred(images: np.ndarray) -> np.ndarray:
    """3x3 box blur of (N, 28, 28, 1) images, background (-1) beyond the border."""
    padded = np.pad(images, ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=-1.0)
    total = np.zeros_like(images)
    for i in range(3):
        for j in range(3):
            total += padded[:, i : i + 28, j : j + 28]
    return total / 9.0


def calibration_rows(seed: int = 0) -> dict[str, np.ndarray]:
    """The calibration's images by row name: the training half (2 sets of 1000) and its damage."""
    train_rows, _ = mnist_split(seed)
    labels = mnist_labels()[train_rows]
    real = load_mnist()[train_rows][: 2 * SET_SIZE]
    rng = np.random.default_rng(seed)
    noise = rng.standard_normal(real.shape).astype(np.float32)
    rows = {"real (the training half)": real}
    for sigma in NOISE_SIGMAS:
        rows[f"real + noise {sigma}"] = np.clip(real + sigma * noise, -1.0, 1.0)
    rows["real blurred"] = _blurred(real)
    threes = load_mnist()[train_rows][labels == 3]
    rows["real, one class (3)"] = threes[rng.integers(0, len(threes), 2 * SET_SIZE)]
    rows["uniform noise"] = rng.uniform(-1.0, 1.0, real.shape).astype(np.float32)
    return rows


def calibrate(scorer: OutsideScorer, seed: int = 0) -> list[dict[str, Any]]:
    """The scorer's figures on each row of :func:`calibration_rows`."""
    out = []
    for name, images in calibration_rows(seed).items():
        score = scorer(images)
        out.append({"row": name, "frechet": score["frechet"], "classes": score["classes"]})
    return out


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| row | Fréchet (CNN) | classes |", "|---|---|---|"]
    lines += [f"| {r['row']} | {r['frechet']:.2f} | {r['classes']} |" for r in rows]
    return "\n".join(lines)


def score_runs(scorer: OutsideScorer, runs: Sequence[str]) -> list[dict[str, Any]]:
    """Each run directory's ``samples.npy`` scored."""
    return [{"run": run, **scorer(np.load(Path(run) / "samples.npy"))} for run in runs]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the calibration (and --score rows) here")
    parser.add_argument("--score", nargs="*", default=[], help="run directories to score")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    scorer = OutsideScorer(args.seed)
    result = {
        "seed": args.seed,
        "held_out_accuracy": scorer.held_out_accuracy,
        "train_half_accuracy": scorer.train_accuracy,
        "calibration": calibrate(scorer, args.seed),
        "runs": score_runs(scorer, args.score),
    }
    print(markdown(result["calibration"]))
    for run in result["runs"]:
        print(f"{run['run']}: Fréchet {run['frechet']:.2f}, {run['classes']} classes")
    if args.json:
        result.update(records.provenance())
        records.write(Path(args.json).with_suffix(""), result, page)
    return 0


def page(result: dict[str, Any]) -> str:
    """The calibration's results page."""
    return records.page(
        "The outside scorer's calibration on MNIST",
        "Generated by `JAX_PLATFORMS=cpu python -m benchmarks.exactness.outside_scorer --json "
        "benchmarks/results/mnist/outside_calibration.json`: a LeNet-shaped CNN trained on the "
        f"held-out half (accuracy {result['held_out_accuracy']:.3f} there, "
        f"{result['train_half_accuracy']:.3f} on the training half it never saw); the Fréchet "
        "distance of its 84 penultimate features, mean over sets of 1,000, to the held-out "
        "half's, on the training half and known damage of it (split and noise seed "
        f"{result['seed']}).",
        markdown(result["calibration"]).splitlines(),
        result,
    )


if __name__ == "__main__":
    sys.exit(main())
