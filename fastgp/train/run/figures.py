"""The end-of-run figure (matplotlib, Agg): samples, critic, input-gradient norms, losses.

    labels = figure_labels(config)        # what the figure names, from the run's TrainConfig
    fig = draw_run(real, fake, norms, records, labels, critic_grid=None, title="")
    save(fig, path)                       # PNG, and the figure closed

2-D data: real vs generated scatter over the critic's contours (``critic_grid`` = (xs, ys, D)).
Images (N, H, W, 1): grids of real and generated samples. Always: a histogram of the critic's
input-gradient norms at the points the run's penalty is taken at (``norms``: point set -> norms),
with the penalty's reference line (WGAN-GP's and LP's target, 0 for R1 and R2), and the curves of
``metrics.jsonl`` named for the run's loss and penalty (:func:`figure_labels`).
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np

from fastgp.train.config import TrainConfig
from fastgp.train.objective.penalties import placement_parts

SIGMA, MINUS = "\N{GREEK SMALL LETTER SIGMA}", "\N{MINUS SIGN}"
# A placement's point set -> how the figure names it.
POINTS = {"interpolates": "the interpolates", "real": "the reals", "fake": "the fakes"}
# The exact R1 kind's name at each placement (R2 is R1 at the fakes).
R1_NAMES = {
    "real": "R1",
    "fake": "R2",
    "real+fake": "R1 + R2",
    "interpolates": "zero-centred penalty at the interpolates",
}
LOSS_NAMES = {
    "wasserstein": "Wasserstein",
    "non-saturating": "non-saturating",
    "relativistic": "relativistic",
}


@dataclasses.dataclass(frozen=True)
class FigureLabels:
    """What a run's figure names: its penalty, where the norms are taken, the reference line and
    the loss curves (``losses``: (metrics.jsonl key, legend label) in drawing order)."""

    penalty: str
    points: tuple[str, ...]  # the placement's point sets, as ``placement_parts`` names them
    norms_xlabel: str
    reference: float
    reference_label: str
    losses: tuple[tuple[str, str], ...]


def penalty_name(config: TrainConfig) -> str:
    """The penalty as the field names it: "WGAN-GP", "R1", "R2", "R1 + R2", "approximate R1
    (sigma = 0.01)" (a Greek sigma), with the points it is taken at where they are not the
    kind's usual ones."""
    placement = config.placement
    if config.gp_kind == "r1":
        return R1_NAMES[placement]
    if config.gp_kind == "approximate-r1":
        name = R1_NAMES[placement]
        return f"approximate {name} ({SIGMA} = {config.gp_sigma:g})"
    name = config.gp_kind.upper()  # WGAN-GP, WGAN-LP
    if placement == "interpolates":
        return name
    return f"{name} at {' and '.join(POINTS[p] for p in placement_parts(placement))}"


def _reference(config: TrainConfig) -> tuple[float, str]:
    """The norm the penalty pulls toward, and its legend label."""
    if config.gp_kind == "wgan-gp":
        return config.gp_target, f"target {config.gp_target:g}"
    if config.gp_kind == "wgan-lp":
        return config.gp_target, f"target {config.gp_target:g} (penalised above it)"
    return 0.0, "target 0"


def _loss_curves(config: TrainConfig, penalty: str) -> tuple[tuple[str, str], ...]:
    """The metrics.jsonl curves of the run's loss: the Wasserstein estimate only where the loss
    is Wasserstein (elsewhere the logged score gap estimates nothing the run optimises)."""
    loss = LOSS_NAMES.get(config.loss, config.loss)
    curves = [("critic_loss", f"critic loss ({loss} + penalty)")]
    if config.loss == "wasserstein":
        curves.append(("wasserstein", f"Wasserstein estimate E D(real) {MINUS} E D(fake)"))
    curves += [("penalty", f"penalty: {penalty}"), ("generator_loss", f"generator loss ({loss})")]
    return tuple(curves)


def figure_labels(config: TrainConfig) -> FigureLabels:
    """The labels of ``config``'s figure: its penalty kind and placement, and its loss."""
    penalty = penalty_name(config)
    points = placement_parts(config.placement)
    reference, reference_label = _reference(config)
    return FigureLabels(
        penalty=penalty,
        points=points,
        norms_xlabel=f"‖∇D(x)‖ at {' and '.join(POINTS[p] for p in points)}",
        reference=reference,
        reference_label=reference_label,
        losses=_loss_curves(config, penalty),
    )


def _image_grid(images: np.ndarray, n: int = 8, pad: int = 1) -> np.ndarray:
    """(N, H, W, 1) in [-1, 1] -> mosaic of the first n*n images, ``pad`` grey pixels apart."""
    images = np.asarray(images)[: n * n, ..., 0]
    count, h, w = images.shape
    grid = np.zeros((n * (h + pad) + pad, n * (w + pad) + pad), np.float32)
    for k in range(count):
        r, c = divmod(k, n)
        top, left = pad + r * (h + pad), pad + c * (w + pad)
        grid[top : top + h, left : left + w] = images[k]
    return grid


def _scatter_panel(ax: Any, real: np.ndarray, fake: np.ndarray, critic_grid: Any) -> None:
    if critic_grid is not None:
        xs, ys, values = critic_grid
        contour = ax.contourf(xs, ys, values, levels=20, cmap="coolwarm", alpha=0.6)
        plt.colorbar(contour, ax=ax, label="critic D(x)")
    ax.scatter(fake[:, 0], fake[:, 1], s=3, c="tab:green", alpha=0.5, label="generated")
    ax.scatter(real[:, 0], real[:, 1], s=1, c="black", alpha=0.4, label="real")
    ax.set_aspect("equal")
    ax.legend(loc="upper right", markerscale=4)
    ax.set_title("real vs generated, critic contours")


def _grid_panel(ax: Any, images: np.ndarray, name: str) -> None:
    ax.imshow(_image_grid(images), cmap="gray", vmin=-1, vmax=1)
    ax.set_title(f"{name} samples")
    ax.axis("off")


def draw_run(
    real: np.ndarray,
    fake: np.ndarray,
    norms: Mapping[str, np.ndarray],
    records: list[dict[str, Any]],
    labels: FigureLabels,
    critic_grid: Any = None,
    title: str = "",
) -> Any:
    """The run's figure (a matplotlib Figure; the caller closes it)."""
    real, fake = np.asarray(real), np.asarray(fake)
    fig, axes = plt.subplots(2, 2, figsize=(11, 9))
    if real.ndim == 2:
        _scatter_panel(axes[0, 0], real, fake, critic_grid)
        _norms_panel(axes[0, 1], norms, labels)
        _loss_panel(axes[1, 0], records, labels)
        _norm_curve_panel(axes[1, 1], records, labels)
    else:
        _grid_panel(axes[0, 0], real, "real")
        _grid_panel(axes[0, 1], fake, "generated")
        _norms_panel(axes[1, 0], norms, labels)
        _loss_panel(axes[1, 1], records, labels)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def save(fig: Any, path: Any) -> None:
    """Write ``fig`` (a :func:`draw_run` figure) to ``path`` as PNG, and close it."""
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _norms_panel(ax: Any, norms: Mapping[str, np.ndarray], labels: FigureLabels) -> None:
    finite = {p: np.asarray(v)[np.isfinite(v)] for p, v in norms.items()}
    # One set of bins, so that the reals' and the fakes' histograms compare bar by bar.
    bins = np.histogram_bin_edges(np.concatenate([np.zeros(0), *finite.values()]), bins=50)
    for points, values in finite.items():
        ax.hist(values, bins=bins, alpha=0.6, label=f"at {POINTS[points]}")
    ax.axvline(labels.reference, color="k", ls="--", lw=1, label=labels.reference_label)
    ax.set_xlabel(labels.norms_xlabel)
    ax.set_ylabel("count")
    ax.set_title(f"critic input-gradient norms ({labels.penalty})")
    ax.legend()


def _loss_panel(ax: Any, records: list[dict[str, Any]], labels: FigureLabels) -> None:
    steps = [r["step"] for r in records]
    for key, label in labels.losses:
        ax.plot(steps, [r[key] for r in records], label=label)
    ax.set_xlabel("generator step")
    ax.set_title("losses (last step of each logged chunk)")
    ax.legend()


def _norm_curve_panel(ax: Any, records: list[dict[str, Any]], labels: FigureLabels) -> None:
    # Rows with a measured norm (none under gp_kind approximate-r1, which takes no input-gradient).
    rows = [r for r in records if any(v is not None for v in r.get("norm_mean") or ())]
    steps = [r["step"] for r in rows]
    for name, style, combine in (
        ("norm_mean", "-", np.nanmean),
        ("norm_min", ":", np.nanmin),
        ("norm_max", ":", np.nanmax),
    ):
        values = [combine([v if v is not None else np.nan for v in r[name]]) for r in rows]
        ax.plot(steps, values, style, label=f"{name} ({combine.__name__[3:]} over cores)")
    ax.axhline(labels.reference, color="k", ls="--", lw=1, label=labels.reference_label)
    ax.set_xlabel("generator step")
    ax.set_ylabel(labels.norms_xlabel)
    what = "input-gradient norms in training" if rows else "no input-gradient norms logged"
    ax.set_title(f"{what} ({labels.penalty})")
    ax.legend()


__all__ = ["FigureLabels", "draw_run", "figure_labels", "penalty_name", "save"]
