"""The end-of-run figure (matplotlib, Agg): samples, critic, input-gradient norms, losses.

    plot_run(path, real, fake, norms, records, critic_grid=None, title="")

2-D data: real vs generated scatter over the critic's contours (``critic_grid`` = (xs, ys, D)).
Images (N, H, W, 1): grids of real and generated samples. Always: a histogram of the critic's
input-gradient norms at the penalty's points (the target 1 marked) and the loss curves of
``metrics.jsonl`` records.
"""

from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np


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


def plot_run(
    path: Any,
    real: np.ndarray,
    fake: np.ndarray,
    norms: np.ndarray,
    records: list[dict[str, Any]],
    critic_grid: Any = None,
    title: str = "",
) -> None:
    """Write the figure to ``path`` (PNG)."""
    real, fake = np.asarray(real), np.asarray(fake)
    fig, axes = plt.subplots(2, 2, figsize=(11, 9))
    if real.ndim == 2:
        _scatter_panel(axes[0, 0], real, fake, critic_grid)
        _norms_panel(axes[0, 1], norms)
        _loss_panel(axes[1, 0], records)
        _norm_curve_panel(axes[1, 1], records)
    else:
        _grid_panel(axes[0, 0], real, "real")
        _grid_panel(axes[0, 1], fake, "generated")
        _norms_panel(axes[1, 0], norms)
        _loss_panel(axes[1, 1], records)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _norms_panel(ax: Any, norms: np.ndarray) -> None:
    norms = np.asarray(norms)
    norms = norms[np.isfinite(norms)]
    ax.hist(norms, bins=50, color="tab:blue", alpha=0.8)
    ax.axvline(1.0, color="k", ls="--", lw=1, label="target 1")
    ax.set_xlabel("||dD/dx|| at interpolates")
    ax.set_ylabel("count")
    ax.set_title("critic input-gradient norms")
    ax.legend()


def _loss_panel(ax: Any, records: list[dict[str, Any]]) -> None:
    steps = [r["step"] for r in records]
    for name in ("critic_loss", "wasserstein", "penalty", "generator_loss"):
        ax.plot(steps, [r[name] for r in records], label=name)
    ax.set_xlabel("generator step")
    ax.set_title("losses (last step of each logged chunk)")
    ax.legend()


def _norm_curve_panel(ax: Any, records: list[dict[str, Any]]) -> None:
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
    ax.axhline(1.0, color="k", ls="--", lw=1)
    ax.set_xlabel("generator step")
    ax.set_title("input-gradient norm statistics")
    ax.legend()


__all__ = ["plot_run"]
