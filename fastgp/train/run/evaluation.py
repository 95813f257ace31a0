"""The run's evaluator: what ``fastgp train`` evaluates, logs and plots.

    Evaluator(dataset, config, problem, n)

It applies the dataset's metric of ``fastgp.train.data.quality``: the mode metric of the 2-D
Gaussian mixtures (``mode_quality``), or the image metric of digits and MNIST (``ImageQuality``:
two-sample tests, a feature distance, classifier confidence and the classes covered, each figure
with the pixel noise it is equivalent to).
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from fastgp.penalty import grad_norms
from fastgp.train.config import TrainConfig
from fastgp.train.data.quality import SPECS, ImageQuality, mode_quality, quality_metric
from fastgp.train.data.sets import toy_modes
from fastgp.train.recipes.defaults import Problem
from fastgp.train.trainers.averaging import sampling_params

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
        """Write the run's figure: samples, the critic's input-gradient norms at the points its
        penalty is taken at, and the logged curves, named for the run's loss and penalty."""
        from fastgp.train.run import figures  # matplotlib, only here

        g_params = sampling_params(state, self.config.g_average)
        d_params = state.d_params
        k_real, k_alpha = jax.random.split(jax.random.fold_in(self.key, 1))
        real = np.asarray(self.problem.sample_real(k_real, self.n), np.float32)
        fake = self.samples(g_params)
        labels = figures.figure_labels(self.config)
        points = {"real": real, "fake": fake}
        if "interpolates" in labels.points:
            alpha = np.asarray(jax.random.uniform(k_alpha, (self.n,)), np.float32)
            alpha = alpha.reshape((-1,) + (1,) * (real.ndim - 1))
            points["interpolates"] = real + alpha * (fake - real)
        norms = {p: np.asarray(self._norms(d_params, points[p])) for p in labels.points}
        grid = None
        if real.ndim == 2:
            both = np.concatenate([real, fake[np.all(np.isfinite(fake), 1)]])
            lo, hi = np.percentile(both, 0.5, 0) - 0.5, np.percentile(both, 99.5, 0) + 0.5
            xs, ys = np.linspace(lo[0], hi[0], 120), np.linspace(lo[1], hi[1], 120)
            mesh = np.stack(np.meshgrid(xs, ys), -1).reshape(-1, 2).astype(np.float32)
            grid = (xs, ys, np.asarray(self._critic(d_params, mesh)).reshape(len(ys), len(xs)))
        fig = figures.draw_run(real, fake, norms, records, labels, critic_grid=grid, title=title)
        figures.save(fig, path)


__all__ = ["DIGITS_RECORD", "Evaluator"]
