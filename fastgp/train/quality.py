"""Mode coverage and sample quality for Gaussian-mixture toy data (the VEEGAN/PacGAN metric)."""

import numpy as np


def mode_quality(samples, centers, sigma: float) -> dict:
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


__all__ = ["mode_quality"]
