"""Evaluation of a generator: the toy sets' mode metric, and the run's evaluator that applies it
or the image datasets' metric.

    mode_quality(samples, centers, sigma)   -> {"modes", "high_quality", "total_modes"} (2-D data)
    Evaluator(dataset, config, problem, n)  what ``fastgp train`` evaluates, logs and plots

**Gaussian mixtures** (the VEEGAN/PacGAN metric): a sample is high quality when it lies within
3 sigma of its nearest mode; a mode is captured when it is the nearest of at least one such
sample.

**Digits and MNIST** (``fastgp.train.digit_quality``, whose names this module re-exports:
``DigitQuality``, ``MnistQuality``, ``NOISE_CURVE``, ...): two-sample tests, a feature distance,
classifier confidence and the classes covered, each figure with the pixel noise it is equivalent
to.
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fastgp.penalty import grad_norms
from fastgp.train.data import toy_modes
from fastgp.train.digit_quality import (
    FRECHET_SETS,
    NOISE_CURVE,
    NOISE_SIGMAS,
    SPECS,
    DigitQuality,
    ImageQuality,
    MnistQuality,
    frechet,
    noise_sigma,
    quality_metric,
)
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


# --- the run's evaluator -----------------------------------------------------------------------

# Image-metric keys logged in metrics.jsonl (the summary holds the whole metric).
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

    Gaussian mixtures: modes captured and high-quality share (:func:`mode_quality`). Digits and
    MNIST: the dataset's ``ImageQuality`` (``quality_metric``; built at the first evaluation,
    then reused) on at least its ``sets_wanted`` generator samples. Swiss roll: no evaluation."""

    def __init__(self, dataset: str, config: TrainConfig, problem: Problem, n: int) -> None:
        self.config, self.problem, self.n = config, problem, n
        self.dataset = dataset
        self.modes = None if problem.image or dataset == "swissroll" else toy_modes(dataset)
        self._metric: ImageQuality | None = None
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
        return self.modes is not None or self.dataset in SPECS

    def image_metric(self) -> ImageQuality:
        """The dataset's image metric, built at the first call."""
        if self._metric is None:
            self._metric = quality_metric(self.dataset)
        return self._metric

    def quality(self, g_params: Any, step: int) -> dict[str, Any] | None:
        """The quality of the generator at ``step`` (computed once per step), or None.

        Gaussian mixtures: {"modes", "high_quality", "total_modes"}; digits and MNIST: the
        ``ImageQuality`` metric (C2ST, Frechet distance and confidence with their real-vs-real
        floors and equivalent noise sigmas, class coverage)."""
        if not self.evaluates:
            return None
        if self._last is not None and self._last[0] == step:
            return self._last[1]
        if self.modes is not None:
            q = mode_quality(self.samples(g_params), *self.modes)
            q = {**q, "high_quality": round(q["high_quality"], 2)}
        else:
            metric = self.image_metric()
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
    "ImageQuality",
    "MnistQuality",
    "NOISE_CURVE",
    "NOISE_SIGMAS",
    "frechet",
    "mode_quality",
    "noise_sigma",
    "quality_metric",
]
