"""Evaluation of a generator: the toy sets' mode metric, the digits metric, and the run's
evaluator that applies them.

    mode_quality(samples, centers, sigma)   -> {"modes", "high_quality", "total_modes"} (2-D data)
    DigitQuality(seed=0)(samples)           -> the digits metric's dict (below)
    Evaluator(dataset, config, problem, n)  what ``fastgp train`` evaluates, logs and plots

**Gaussian mixtures** (the VEEGAN/PacGAN metric): a sample is high quality when it lies within
3 sigma of its nearest mode; a mode is captured when it is the nearest of at least one such
sample.

**Digits** (``DigitQuality``): two-sample tests, a feature distance, classifier confidence and the
classes covered, each figure with the pixel noise it is equivalent to.

    metric = DigitQuality()   # splits the digits, fits the classifiers, measures the floors
    metric(samples)           # (N, 8, 8, 1) or (N, 64) in [-1, 1], N >= 898 -> one dict:
      c2st_accuracy, c2st_floor  the stronger of the two C2STs below; the same on real vs real
      c2st_svm, c2st_mlp         the two C2STs (RBF SVM, MLP on raw pixels), 5-fold
      c2st_sigma                 sigma of the pixel noise whose calibration C2ST is c2st_accuracy
      frechet_distance, frechet_floor, frechet_sigma    the same for the Frechet distance, the
                                 mean over frechet_sets = N // 898 disjoint sets of 898 samples
      frechet_spread             the standard deviation of the sets' distances (0.0 for one set)
      confidence, confidence_floor, confidence_sigma    and for the classifier's mean confidence
      c2st_samples (898), classes_covered, class_entropy, class_histogram (10 counts)

scikit-learn's 1797 digits are split into two class-stratified halves (fixed ``seed``;
``fastgp.train.data.digit_split``): ``fastgp train --dataset digits`` trains on the first (the
split of seed 0), the second is the held-out real reference. Every ``*_floor`` is the figure of
the first half itself, each digit once: what 898 fresh draws of real digits score. A generator
that reproduces its training half exactly draws those digits with replacement, and scores worse
(``digit_calibration``'s resampled row, above the floors on every split seed and draw: a test).

C2ST (classifier two-sample test, Lopez-Paz & Oquab 2017): the first n samples (n = 898, the
held-out half) labelled 0, the held-out digits 1; the 5-fold cross-validated accuracy of a
classifier told to separate them (0.5: indistinguishable, 1.0: every sample told apart), for an
RBF SVM (C = 10, kernel width sklearn's "scale" of the real digits) and an MLP (128 ReLU units,
50 epochs); ``c2st_accuracy`` is the larger. It sees pixel grain (the calibration's noise rows).

Digit classifier: an MLP (64 ReLU units) fitted on the held-out half, so the samples and the floor
are equally unseen by it. Its labels give the coverage
(``class_entropy`` = entropy / log 10; ``classes_covered``: classes with >= 2.5 % of all
samples); ``confidence`` is its mean top-class probability; ``frechet_distance`` is the Frechet
distance between Gaussians fitted to its hidden activations of the samples and of the held-out
digits (FID's recipe, with this classifier in place of Inception). Both see shapes and classes,
hardly grain. With 898 samples a side the distance is mostly finite-sample error (the floor), and
one generator's disjoint sets of 898 samples spread by more than the calibration's steps from
sigma 0 to 0.1 (docs/trainer.md); so it is averaged over every whole set of 898 samples given,
each set scored as the floor is (same size, same bias), and callers pass ``sets_wanted`` of them.

``*_sigma``: the sigma of the clipped Gaussian pixel noise whose calibration row scores the
figure (``NOISE_CURVE``: seed 0, the first half + N(0, sigma^2) clipped to [-1, 1]; the table in
``fastgp.train.digit_calibration``), linear between rows; 0.0 at or past the floor, 0.4 (the last
row) for anything at least as bad as sigma 0.4. Deterministic for a ``seed``.
"""

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fastgp.penalty import grad_norms
from fastgp.train.data import toy_modes
from fastgp.train.recipes import Problem
from fastgp.train.state import TrainConfig

# --- Gaussian mixtures --------------------------------------------------------------------------


def mode_quality(samples: Any, centers: Any, sigma: float) -> dict[str, Any]:
    """Modes captured and percentage of high-quality samples.

    samples (N, 2), centers (M, 2), sigma the per-mode std (all in data coordinates). A sample is
    high quality when it lies within 3 * sigma (Euclidean) of its nearest center; a mode is
    captured when it is the nearest center of at least one high-quality sample.
    Returns ``{"modes": int, "high_quality": float percent, "total_modes": int}``.
    """
    samples = np.asarray(samples, np.float64)
    centers = np.asarray(centers, np.float64)
    if samples.ndim != 2 or centers.ndim != 2 or samples.shape[1] != centers.shape[1]:
        raise ValueError(
            f"samples {samples.shape} and centers {centers.shape} must be (N, d) "
            f"and (M, d) with the same d"
        )
    if samples.shape[0] == 0 or centers.shape[0] == 0:
        raise ValueError(
            f"need at least one sample and one center, got samples {samples.shape} "
            f"and centers {centers.shape}"
        )
    if not sigma > 0:
        raise ValueError(f"sigma must be positive, got {sigma}")
    dist = np.linalg.norm(samples[:, None, :] - centers[None, :, :], axis=-1)  # (N, M)
    nearest = dist.argmin(axis=1)
    # A non-finite sample (diverged generator) has a NaN distance and is never high quality.
    good = dist[np.arange(len(samples)), nearest] <= 3.0 * sigma
    return {
        "modes": int(np.unique(nearest[good]).size),
        "high_quality": float(100.0 * good.mean()),
        "total_modes": int(centers.shape[0]),
    }


# --- digits -------------------------------------------------------------------------------------

PIXELS = 64
CLASSES = 10
COVERED_SHARE = 0.25 / CLASSES
FOLDS = 5
SVM_C = 10.0
FRECHET_SETS = 8  # sets of n_samples whose Frechet distances an evaluation averages

# Calibration of the *_sigma figures: seed 0, the first half + clipped N(0, sigma^2) pixel noise
# (sigma 0 is real vs real; FRECHET_SETS noise draws), as printed by
# `python -m fastgp.train.digit_calibration`; a test checks it against a fresh computation.
NOISE_SIGMAS = (0.0, 0.025, 0.05, 0.1, 0.2, 0.4)
NOISE_CURVE = {
    "c2st_accuracy": (0.5039, 0.5473, 0.7038, 0.9126, 0.9788, 0.9911),
    "frechet_distance": (0.4265, 0.4339, 0.4712, 0.6363, 1.359, 4.5472),
    "confidence": (0.973, 0.9726, 0.9719, 0.97, 0.9632, 0.9384),
}


@contextlib.contextmanager
def _quiet_sklearn() -> Iterator[None]:
    """One BLAS thread (sklearn's MLPs run many times slower on shared cores with more) and no
    convergence warnings (the C2ST's MLP stops at a fixed epoch count on purpose)."""
    from sklearn.exceptions import ConvergenceWarning
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1), warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        yield


def noise_sigma(name: str, value: float) -> float:
    """The noise sigma whose ``NOISE_CURVE[name]`` entry is ``value`` (linear between rows; 0.0 at
    or past the floor, ``NOISE_SIGMAS[-1]`` past the last row)."""
    curve = np.asarray(NOISE_CURVE[name], np.float64)
    if name == "confidence":  # falls with noise
        curve, value = -curve, -value
    curve = np.maximum.accumulate(curve)  # flat where the figure saturates
    return round(float(np.interp(value, curve, NOISE_SIGMAS)), 4)


def frechet(a: np.ndarray, b: np.ndarray) -> float:
    """Frechet distance between Gaussians fitted to the rows of ``a`` (n, d) and ``b`` (m, d):
    |mu_a - mu_b|^2 + tr(C_a + C_b - 2 (C_a^1/2 C_b C_a^1/2)^1/2), by symmetric eigensolves
    (exact for the singular covariances of dead ReLU units)."""
    ca, cb = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    w, v = np.linalg.eigh(ca)
    root_a = (v * np.sqrt(np.clip(w, 0.0, None))) @ v.T
    cross = np.sqrt(np.clip(np.linalg.eigvalsh(root_a @ cb @ root_a), 0.0, None)).sum()
    return float(np.sum((a.mean(0) - b.mean(0)) ** 2) + np.trace(ca) + np.trace(cb) - 2 * cross)


class DigitQuality:
    """The digits metric; call it on (N, 8, 8, 1) or (N, 64) samples in [-1, 1], N >= n_samples."""

    def __init__(self, seed: int = 0):
        from sklearn.neural_network import MLPClassifier

        from fastgp.train.data import digit_labels, digit_split, load_digits

        images = load_digits().reshape(-1, PIXELS)  # float32 in [-1, 1]
        first, held_out = digit_split(seed)
        self.seed = seed
        self.train_index, self.held_out_index = first, held_out  # rows of load_digits()
        self.train_images = images[first]
        self.held_out = images[held_out]
        self.n_samples = len(held_out)
        self.sets_wanted = FRECHET_SETS * self.n_samples  # samples a caller should pass
        self.gamma = 1.0 / (PIXELS * float(images.var()))  # sklearn's "scale", real data only
        real = self.train_images[: self.n_samples]  # the floor of every figure
        with _quiet_sklearn():
            # Fitted on the held-out half: the samples and the first half are both unseen by it.
            self.classifier = MLPClassifier((64,), alpha=1e-3, max_iter=300, random_state=seed)
            self.classifier.fit(self.held_out, digit_labels()[held_out])
            self._reference = self.features(self.held_out)
            self.floor_tests = self.c2st(real)
            self.frechet_floor = frechet(self.features(real), self._reference)
            self.confidence_floor = self.confidence(real)
        self.floor = max(self.floor_tests.values())

    def features(self, flat: np.ndarray) -> np.ndarray:
        """(n, 64) digits -> (n, 64) hidden ReLU activations of the digit classifier."""
        return np.maximum(flat @ self.classifier.coefs_[0] + self.classifier.intercepts_[0], 0.0)

    def confidence(self, flat: np.ndarray) -> float:
        """Mean top-class probability of the digit classifier on (n, 64) digits."""
        return float(np.mean(np.max(self.classifier.predict_proba(flat), 1)))

    def c2st(self, samples: np.ndarray) -> dict[str, Any]:
        """{"svm", "mlp"}: 5-fold cross-validated accuracies of each classifier separating
        ``samples`` (n, 64) from the held-out digits (n = ``n_samples``); same folds for both."""
        from sklearn.model_selection import StratifiedKFold, cross_val_score
        from sklearn.neural_network import MLPClassifier
        from sklearn.svm import SVC

        tests = {
            "svm": SVC(C=SVM_C, gamma=self.gamma),
            "mlp": MLPClassifier(
                (128,), learning_rate_init=3e-3, batch_size=100, max_iter=50, random_state=self.seed
            ),
        }
        both = np.concatenate([samples, self.held_out])
        labels = np.r_[np.zeros(len(samples)), np.ones(len(self.held_out))]
        folds = StratifiedKFold(FOLDS, shuffle=True, random_state=self.seed)
        with _quiet_sklearn():
            return {
                name: float(np.mean(cross_val_score(test, both, labels, cv=folds)))
                for name, test in tests.items()
            }

    def __call__(self, samples: Any) -> dict[str, Any]:
        """The metric of ``samples`` (generator output in data coordinates); JSON-ready values."""
        flat = np.asarray(samples, np.float32)
        flat = flat.reshape(flat.shape[0], -1) if flat.ndim else flat
        if flat.ndim != 2 or flat.shape[1] != PIXELS:
            raise ValueError(
                f"samples must be (N, 8, 8, 1) or (N, 64) digits, got {np.shape(samples)}"
            )
        if flat.shape[0] < self.n_samples:
            raise ValueError(
                f"the digits metric needs at least {self.n_samples} samples (the "
                f"held-out half), got {flat.shape[0]}"
            )
        if not np.all(np.isfinite(flat)):
            raise ValueError(
                f"{int(np.sum(~np.all(np.isfinite(flat), 1)))} of {flat.shape[0]} "
                f"samples are not finite"
            )
        first = flat[: self.n_samples]
        tests = self.c2st(first)
        with _quiet_sklearn():
            counts = np.bincount(self.classifier.predict(flat), minlength=CLASSES)
            confidence = self.confidence(flat)
        sets = flat[: len(flat) // self.n_samples * self.n_samples].reshape(
            -1, self.n_samples, PIXELS
        )
        distances = [frechet(self.features(one), self._reference) for one in sets]
        fd = float(np.mean(distances))
        share = counts / counts.sum()
        entropy = -np.sum(share[share > 0] * np.log(share[share > 0])) / np.log(CLASSES)
        accuracy = max(tests.values())
        return {
            "c2st_accuracy": round(accuracy, 4),
            "c2st_floor": round(self.floor, 4),
            "c2st_svm": round(tests["svm"], 4),
            "c2st_mlp": round(tests["mlp"], 4),
            "c2st_sigma": noise_sigma("c2st_accuracy", accuracy),
            "frechet_distance": round(fd, 4),
            "frechet_floor": round(self.frechet_floor, 4),
            "frechet_sigma": noise_sigma("frechet_distance", fd),
            "frechet_sets": len(distances),
            "frechet_spread": round(float(np.std(distances)), 4),
            "confidence": round(confidence, 4),
            "confidence_floor": round(self.confidence_floor, 4),
            "confidence_sigma": noise_sigma("confidence", confidence),
            "c2st_samples": self.n_samples,
            "classes_covered": int(np.sum(share >= COVERED_SHARE)),
            "class_entropy": round(float(entropy) + 0.0, 4),
            "class_histogram": [int(c) for c in counts],
        }


# --- the run's evaluator -----------------------------------------------------------------------

# Digits-metric keys logged in metrics.jsonl (the summary holds the whole metric).
DIGITS_RECORD = (
    "c2st_accuracy",
    "c2st_floor",
    "c2st_sigma",
    "frechet_distance",
    "frechet_spread",
    "frechet_sigma",
    "confidence",
    "classes_covered",
    "class_entropy",
)


class Evaluator:
    """Host-side evaluation on this process's copy of the parameters (no collectives).

    Gaussian mixtures: modes captured and high-quality share (:func:`mode_quality`). Digits:
    :class:`DigitQuality` (built at the first evaluation, then reused) on at
    least its ``sets_wanted`` generator samples. Swiss roll: no evaluation."""

    def __init__(self, dataset: str, config: TrainConfig, problem: Problem, n: int) -> None:
        self.config, self.problem, self.n = config, problem, n
        self.dataset = dataset
        self.modes = None if problem.image or dataset == "swissroll" else toy_modes(dataset)
        self._digits: DigitQuality | None = None
        # (step, quality) of the latest evaluation
        self._last: tuple[int, dict[str, Any] | None] | None = None
        self.key = jax.random.PRNGKey(config.seed + 10_000)
        latent = config.latent_dim
        gen, critic = problem.generator, problem.critic
        self._sample = jax.jit(
            lambda p, key, n: gen.apply(
                p, jax.random.normal(key, (n, latent), jnp.float32), dtype=config.dtype
            ),
            static_argnums=2,
        )
        self._critic = jax.jit(lambda p, x: critic.apply(p, x, dtype=config.dtype))
        self._norms = jax.jit(
            lambda p, x: grad_norms(
                jax.grad(lambda y: jnp.sum(critic.apply(p, y, dtype=config.dtype)))(x),
                backend="xla",
            )
        )

    def samples(self, g_params: Any, n: int | None = None) -> np.ndarray:
        return np.asarray(self._sample(g_params, self.key, n or self.n), np.float32)

    @property
    def evaluates(self) -> bool:
        """Whether this dataset has a quality evaluation (runs stop at --eval-every for it)."""
        return self.modes is not None or self.dataset == "digits"

    def digits_metric(self) -> "DigitQuality":
        if self._digits is None:
            self._digits = DigitQuality()
        return self._digits

    def quality(self, g_params: Any, step: int) -> dict[str, Any] | None:
        """The quality of the generator at ``step`` (computed once per step), or None.

        Gaussian mixtures: {"modes", "high_quality", "total_modes"}; digits: the
        ``DigitQuality`` metric (C2ST, Frechet distance and confidence with their real-vs-real
        floors and equivalent noise sigmas, class coverage)."""
        if not self.evaluates:
            return None
        if self._last is not None and self._last[0] == step:
            return self._last[1]
        if self.modes is not None:
            q = mode_quality(self.samples(g_params), *self.modes)
            q = {**q, "high_quality": round(q["high_quality"], 2)}
        else:
            metric = self.digits_metric()
            q = metric(self.samples(g_params, max(self.n, metric.sets_wanted)))
        self._last = (step, q)
        return q

    @staticmethod
    def record(quality: dict[str, Any] | None) -> dict[str, Any] | None:
        """The part of ``quality`` that goes into a metrics.jsonl line."""
        if quality is None or "c2st_accuracy" not in quality:
            return quality
        return {k: quality[k] for k in DIGITS_RECORD}

    @staticmethod
    def headline(quality: dict[str, Any] | None) -> str:
        """``quality`` in a few words, for the figure's title ("" if None)."""
        if quality is None:
            return ""
        if "modes" in quality:
            return (
                f", {quality['modes']}/{quality['total_modes']} modes, "
                f"{quality['high_quality']:.1f}% high quality"
            )
        return (
            f", C2ST {quality['c2st_accuracy']:.3f} (real {quality['c2st_floor']:.3f}, "
            f"noise sigma {quality['c2st_sigma']:.3f}), FD {quality['frechet_distance']:.2f} "
            f"(real {quality['frechet_floor']:.2f}), {quality['classes_covered']}/10 classes"
        )

    def figure(self, path: Any, state: Any, records: list[dict[str, Any]], title: str) -> None:
        g_params, d_params = state.g_params, state.d_params
        k_real, k_alpha = jax.random.split(jax.random.fold_in(self.key, 1))
        real = np.asarray(self.problem.sample_real(k_real, self.n), np.float32)
        fake = self.samples(g_params)
        alpha = np.asarray(jax.random.uniform(k_alpha, (self.n,)), np.float32)
        alpha = alpha.reshape((-1,) + (1,) * (real.ndim - 1))
        norms = np.asarray(self._norms(d_params, real + alpha * (fake - real)))
        grid = None
        if real.ndim == 2:
            both = np.concatenate([real, fake[np.all(np.isfinite(fake), 1)]])
            lo, hi = np.percentile(both, 0.5, 0) - 0.5, np.percentile(both, 99.5, 0) + 0.5
            xs, ys = np.linspace(lo[0], hi[0], 120), np.linspace(lo[1], hi[1], 120)
            mesh = np.stack(np.meshgrid(xs, ys), -1).reshape(-1, 2).astype(np.float32)
            grid = (xs, ys, np.asarray(self._critic(d_params, mesh)).reshape(len(ys), len(xs)))
        from fastgp.train.figures import plot_run  # matplotlib, only where a figure is drawn

        plot_run(path, real, fake, norms, records, critic_grid=grid, title=title)


__all__ = [
    "DIGITS_RECORD",
    "DigitQuality",
    "Evaluator",
    "FRECHET_SETS",
    "NOISE_CURVE",
    "NOISE_SIGMAS",
    "frechet",
    "mode_quality",
    "noise_sigma",
]
