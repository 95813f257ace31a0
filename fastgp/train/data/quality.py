"""The quality of generated samples: the 2-D mixtures' mode metric, and the metric of the two digit
datasets (scikit-learn's 8x8 digits, 28x28 MNIST): two-sample tests, a feature distance,
classifier confidence and the classes covered, each figure with the pixel noise it is equivalent
to.

    mode_quality(samples, centers, sigma) -> {"modes", "high_quality", "total_modes"} (2-D data)
    ImageQuality(spec, seed=0)(samples)  -> the metric's dict (below), for a QualitySpec
    DigitQuality(seed=0), MnistQuality(seed=0)   the metric of 8x8 digits, of 28x28 MNIST
    quality_metric(dataset, seed=0)      -> the metric of "digits" or "mnist"
    noise_sigma(name, value, spec=DIGITS) -> the noise sigma a figure is equivalent to

    metric = DigitQuality()   # splits the dataset, fits the classifiers, measures the floors
    metric(samples)           # (N, H, W, 1) or (N, H * W) in [-1, 1], N >= n_samples -> one dict:
      c2st_accuracy, c2st_floor  the stronger of the two C2STs below; the same on real vs real
      c2st_svm, c2st_mlp         the two C2STs (RBF SVM, MLP on raw pixels), 5-fold
      c2st_sigma                 sigma of the pixel noise whose calibration C2ST is c2st_accuracy
      frechet_distance, frechet_floor, frechet_sigma    the same for the Frechet distance, the
                                 mean over frechet_sets = N // n_samples disjoint sets of samples
      frechet_spread             the standard deviation of the sets' distances (0.0 for one set)
      confidence, confidence_floor, confidence_sigma    and for the classifier's mean confidence
      c2st_samples (n_samples), classes_covered, class_entropy, class_histogram (10 counts)

**Gaussian mixtures** (the VEEGAN/PacGAN metric): a sample is high quality when it lies within
3 sigma of its nearest mode; a mode is captured when it is the nearest of at least one such
sample.

**Digits and MNIST.** A dataset's images are split into two class-stratified halves (fixed ``seed``;
``digit_split`` and ``mnist_split`` of ``fastgp.train.data.sets``): ``fastgp train`` trains on the
first (the split of seed 0), the second is the held-out real reference. ``n_samples`` is the size of
one set of samples: the held-out half for the digits (898), 1000 for MNIST (a C2ST on both
2500-digit halves would cost six times more; one call takes 2-5 s on two shared cores). Every
``*_floor`` is the figure of the first half's whole sets of ``n_samples``, each image once (the
C2ST's: the first set; the Frechet distance: the mean over the sets, one of 898 digits, two of 1000
MNIST digits): what fresh draws of real images score. A generator that reproduces its training half
exactly draws those images with replacement, and scores worse (``calibration``'s resampled
row).

C2ST (classifier two-sample test, Lopez-Paz & Oquab 2017): the first ``n_samples`` samples
labelled 0, as many held-out images 1; the 5-fold cross-validated accuracy of a classifier told
to separate them (0.5: indistinguishable, 1.0: every sample told apart), for an RBF SVM (C = 10,
kernel width sklearn's "scale" of the real images) and an MLP (one ReLU layer, a fixed number of
epochs: the spec's ``c2st_mlp``); ``c2st_accuracy`` is the larger. It sees pixel grain (the
calibration's noise rows).

Digit classifier: an MLP (``CLASSIFIER_WIDTH`` ReLU units) fitted on the whole held-out half, so the
samples and the floor are equally unseen by it. Its labels give the coverage (``class_entropy`` =
entropy / log 10; ``classes_covered``: classes with >= 2.5 % of all samples); ``confidence`` is its
mean top-class probability; ``frechet_distance`` is the Frechet distance between Gaussians fitted to
its hidden activations of a set of samples and of the whole held-out half (FID's recipe, with this
classifier in place of Inception). Both see shapes and classes, hardly grain. With a few hundred
samples a side the distance is mostly finite-sample error (the floor), and one generator's disjoint
sets spread by more than the calibration's smallest noise steps (docs/trainer.md); so it is averaged
over every whole set of ``n_samples`` given, each set scored as the floor is (same size, same bias),
and callers pass ``sets_wanted`` samples.

``*_sigma``: the sigma of the clipped Gaussian pixel noise whose calibration row scores the
figure (the spec's ``curve``: seed 0, the first half + N(0, sigma^2) clipped to [-1, 1]; the
tables of ``fastgp.train.data.calibration``), linear between rows; 0.0 at or past the floor, the
last sigma for anything at least as bad as it. Deterministic for a ``seed``.
"""

import contextlib
import warnings
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np

from fastgp.train.data import sets

CLASSES = 10
COVERED_SHARE = 0.25 / CLASSES
FOLDS = 5
SVM_C = 10.0
CLASSIFIER_WIDTH = 64  # hidden ReLU units of the image classifier
FRECHET_SETS = 8  # sets of n_samples whose Frechet distances an evaluation averages


class QualitySpec(NamedTuple):
    """An image dataset's metric: its data, the sizes of its sets and classifiers, and its
    calibration (``sigmas`` ascending from 0.0, ``curve``: figure -> its value at each sigma)."""

    name: str
    image: tuple[int, int, int]
    load: Callable[[], np.ndarray]  # every image, (N, H, W, C) in [-1, 1]
    labels: Callable[[], np.ndarray]
    split: Callable[[int], tuple[np.ndarray, np.ndarray]]  # seed -> (first rows, held-out rows)
    set_size: int | None  # samples per set (C2ST, Frechet); None: the held-out half's size
    c2st_mlp: tuple[int, float, int]  # the C2ST MLP's hidden units, learning rate, epochs
    sigmas: tuple[float, ...]
    curve: dict[str, tuple[float, ...]]


# Calibration of the *_sigma figures: seed 0, the first half + clipped N(0, sigma^2) pixel noise
# (sigma 0 is real vs real; FRECHET_SETS noise draws), as printed by
# `python -m fastgp.train.data.calibration [--dataset mnist]`; tests check them against a fresh
# computation.
NOISE_SIGMAS = (0.0, 0.025, 0.05, 0.1, 0.2, 0.4)
NOISE_CURVE: dict[str, tuple[float, ...]] = {
    "c2st_accuracy": (0.5039, 0.5473, 0.7038, 0.9126, 0.9788, 0.9911),
    "frechet_distance": (0.4265, 0.4339, 0.4712, 0.6363, 1.359, 4.5472),
    "confidence": (0.973, 0.9726, 0.9719, 0.97, 0.9632, 0.9384),
}
MNIST_NOISE_SIGMAS = (0.0, 0.0125, 0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6)
MNIST_NOISE_CURVE: dict[str, tuple[float, ...]] = {
    "c2st_accuracy": (0.5155, 0.54, 0.6265, 0.878, 0.995, 1.0, 1.0, 1.0, 1.0),
    "frechet_distance": (1.6508, 1.6656, 1.727, 2.0007, 3.1601, 7.922, 27.083, 101.1187, 291.0635),
    "confidence": (0.962, 0.9617, 0.9615, 0.961, 0.9597, 0.9562, 0.9464, 0.9074, 0.8087),
}

DIGITS = QualitySpec(
    name="digits",
    image=(8, 8, 1),
    load=sets.load_digits,
    labels=sets.digit_labels,
    split=sets.digit_split,
    set_size=None,
    c2st_mlp=(128, 3e-3, 50),
    sigmas=NOISE_SIGMAS,
    curve=NOISE_CURVE,
)
MNIST = QualitySpec(
    name="mnist",
    image=sets.MNIST_SHAPE,
    load=sets.load_mnist,
    labels=sets.mnist_labels,
    split=sets.mnist_split,
    set_size=1000,
    c2st_mlp=(128, 1e-3, 20),
    sigmas=MNIST_NOISE_SIGMAS,
    curve=MNIST_NOISE_CURVE,
)
SPECS = {spec.name: spec for spec in (DIGITS, MNIST)}


@contextlib.contextmanager
def _quiet_sklearn() -> Iterator[None]:
    """One BLAS thread (sklearn's MLPs run many times slower on shared cores with more) and no
    convergence warnings (the C2ST's MLP stops at a fixed epoch count on purpose)."""
    from sklearn.exceptions import ConvergenceWarning
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1), warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        yield


def noise_sigma(name: str, value: float, spec: QualitySpec = DIGITS) -> float:
    """The noise sigma whose ``spec.curve[name]`` entry is ``value`` (linear between rows; 0.0 at
    or past the floor, ``spec.sigmas[-1]`` past the last row)."""
    curve = np.asarray(spec.curve[name], np.float64)
    if name == "confidence":  # falls with noise
        curve, value = -curve, -value
    curve = np.maximum.accumulate(curve)  # flat where the figure saturates
    return round(float(np.interp(value, curve, spec.sigmas)), 4)


def frechet(a: np.ndarray, b: np.ndarray) -> float:
    """Frechet distance between Gaussians fitted to the rows of ``a`` (n, d) and ``b`` (m, d):
    |mu_a - mu_b|^2 + tr(C_a + C_b - 2 (C_a^1/2 C_b C_a^1/2)^1/2), by symmetric eigensolves
    (exact for the singular covariances of dead ReLU units)."""
    ca, cb = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    w, v = np.linalg.eigh(ca)
    root_a = (v * np.sqrt(np.clip(w, 0.0, None))) @ v.T
    cross = np.sqrt(np.clip(np.linalg.eigvalsh(root_a @ cb @ root_a), 0.0, None)).sum()
    return float(np.sum((a.mean(0) - b.mean(0)) ** 2) + np.trace(ca) + np.trace(cb) - 2 * cross)


class ImageQuality:
    """The metric of ``spec``'s images; call it on (N, H, W, C) or (N, H * W * C) samples in
    [-1, 1], N >= ``n_samples``."""

    def __init__(self, spec: QualitySpec, seed: int = 0):
        from sklearn.neural_network import MLPClassifier

        images = spec.load().reshape(-1, self._pixels(spec))  # float32 in [-1, 1]
        first, held_out = spec.split(seed)
        self.spec, self.seed = spec, seed
        self.train_index, self.held_out_index = first, held_out  # rows of spec.load()
        self.train_images = images[first]
        self.held_out = images[held_out]
        self.n_samples = spec.set_size or len(held_out)
        self.sets_wanted = FRECHET_SETS * self.n_samples  # samples a caller should pass
        self.gamma = 1.0 / (images.shape[1] * float(images.var()))  # sklearn's "scale"
        # The floor of every figure: the first half's whole sets of n_samples, each image once.
        self.real = self.train_images[: len(first) // self.n_samples * self.n_samples]
        with _quiet_sklearn():
            # Fitted on the held-out half: the samples and the first half are both unseen by it.
            self.classifier = MLPClassifier(
                (CLASSIFIER_WIDTH,), alpha=1e-3, max_iter=300, random_state=seed
            )
            self.classifier.fit(self.held_out, spec.labels()[held_out])
            self._reference = self.features(self.held_out)
            self.floor_tests = self.c2st(self.real[: self.n_samples])
            self.frechet_floor = float(np.mean(self.frechet_sets(self.real)))
            self.confidence_floor = self.confidence(self.real)
        self.floor = max(self.floor_tests.values())

    @staticmethod
    def _pixels(spec: QualitySpec) -> int:
        return int(np.prod(spec.image))

    def features(self, flat: np.ndarray) -> np.ndarray:
        """(n, pixels) images -> (n, width) hidden ReLU activations of the image classifier."""
        return np.maximum(flat @ self.classifier.coefs_[0] + self.classifier.intercepts_[0], 0.0)

    def frechet_sets(self, flat: np.ndarray) -> list[float]:
        """The Frechet distance of each whole set of ``n_samples`` of (N, pixels) ``flat`` (a
        remainder short of a set is left out) to the held-out half."""
        n = self.n_samples
        sets = flat[: len(flat) // n * n].reshape(-1, n, flat.shape[1])
        return [frechet(self.features(one), self._reference) for one in sets]

    def confidence(self, flat: np.ndarray) -> float:
        """Mean top-class probability of the image classifier on (n, pixels) images."""
        return float(np.mean(np.max(self.classifier.predict_proba(flat), 1)))

    def c2st(self, samples: np.ndarray) -> dict[str, Any]:
        """{"svm", "mlp"}: 5-fold cross-validated accuracies of each classifier separating
        ``samples`` (n, pixels) from the first n held-out images (n = ``n_samples``); the same
        folds for both."""
        from sklearn.model_selection import StratifiedKFold, cross_val_score
        from sklearn.neural_network import MLPClassifier
        from sklearn.svm import SVC

        width, lr, epochs = self.spec.c2st_mlp
        tests = {
            "svm": SVC(C=SVM_C, gamma=self.gamma),
            "mlp": MLPClassifier(
                (width,),
                learning_rate_init=lr,
                batch_size=100,
                max_iter=epochs,
                random_state=self.seed,
            ),
        }
        reference = self.held_out[: self.n_samples]
        both = np.concatenate([samples, reference])
        labels = np.r_[np.zeros(len(samples)), np.ones(len(reference))]
        folds = StratifiedKFold(FOLDS, shuffle=True, random_state=self.seed)
        with _quiet_sklearn():
            return {
                name: float(np.mean(cross_val_score(test, both, labels, cv=folds)))
                for name, test in tests.items()
            }

    def _flat(self, samples: Any) -> np.ndarray:
        """``samples`` as (N, pixels) float32; ValueError for another shape, too few or
        non-finite samples."""
        flat = np.asarray(samples, np.float32)
        flat = flat.reshape(flat.shape[0], -1) if flat.ndim else flat
        spec, pixels = self.spec, self._pixels(self.spec)
        if flat.ndim != 2 or flat.shape[1] != pixels:
            shape = ", ".join(str(s) for s in spec.image)
            raise ValueError(
                f"samples must be (N, {shape}) or (N, {pixels}) {spec.name} images, "
                f"got {np.shape(samples)}"
            )
        if flat.shape[0] < self.n_samples:
            raise ValueError(
                f"the {spec.name} metric needs at least {self.n_samples} samples (one set "
                f"of its two-sample tests), got {flat.shape[0]}"
            )
        if not np.all(np.isfinite(flat)):
            raise ValueError(
                f"{int(np.sum(~np.all(np.isfinite(flat), 1)))} of {flat.shape[0]} "
                f"samples are not finite"
            )
        return flat

    def __call__(self, samples: Any) -> dict[str, Any]:
        """The metric of ``samples`` (generator output in data coordinates); JSON-ready values."""
        flat = self._flat(samples)
        n, spec = self.n_samples, self.spec
        tests = self.c2st(flat[:n])
        with _quiet_sklearn():
            counts = np.bincount(self.classifier.predict(flat), minlength=CLASSES)
            confidence = self.confidence(flat)
        distances = self.frechet_sets(flat)
        fd = float(np.mean(distances))
        share = counts / counts.sum()
        entropy = -np.sum(share[share > 0] * np.log(share[share > 0])) / np.log(CLASSES)
        accuracy = max(tests.values())
        return {
            "c2st_accuracy": round(accuracy, 4),
            "c2st_floor": round(self.floor, 4),
            "c2st_svm": round(tests["svm"], 4),
            "c2st_mlp": round(tests["mlp"], 4),
            "c2st_sigma": noise_sigma("c2st_accuracy", accuracy, spec),
            "frechet_distance": round(fd, 4),
            "frechet_floor": round(self.frechet_floor, 4),
            "frechet_sigma": noise_sigma("frechet_distance", fd, spec),
            "frechet_sets": len(distances),
            "frechet_spread": round(float(np.std(distances)), 4),
            "confidence": round(confidence, 4),
            "confidence_floor": round(self.confidence_floor, 4),
            "confidence_sigma": noise_sigma("confidence", confidence, spec),
            "c2st_samples": n,
            "classes_covered": int(np.sum(share >= COVERED_SHARE)),
            "class_entropy": round(float(entropy) + 0.0, 4),
            "class_histogram": [int(c) for c in counts],
        }


class DigitQuality(ImageQuality):
    """The metric of scikit-learn's 8x8 digits (:data:`DIGITS`)."""

    def __init__(self, seed: int = 0):
        super().__init__(DIGITS, seed)


class MnistQuality(ImageQuality):
    """The metric of the 28x28 MNIST digits (:data:`MNIST`)."""

    def __init__(self, seed: int = 0):
        super().__init__(MNIST, seed)


def quality_metric(dataset: str, seed: int = 0) -> ImageQuality:
    """The metric of image dataset ``dataset`` ("digits" or "mnist")."""
    if dataset not in SPECS:
        raise ValueError(f"no image metric for {dataset!r}; valid: {', '.join(SPECS)}")
    return ImageQuality(SPECS[dataset], seed)


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


__all__ = [
    "CLASSES",
    "CLASSIFIER_WIDTH",
    "DIGITS",
    "DigitQuality",
    "FRECHET_SETS",
    "ImageQuality",
    "MNIST",
    "MNIST_NOISE_CURVE",
    "MNIST_NOISE_SIGMAS",
    "MnistQuality",
    "NOISE_CURVE",
    "NOISE_SIGMAS",
    "QualitySpec",
    "SPECS",
    "frechet",
    "mode_quality",
    "noise_sigma",
    "quality_metric",
]
