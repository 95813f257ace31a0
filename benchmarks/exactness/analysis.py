"""The declared study's statistics (docs/study.md): a run's primary metric and collapse, the
paired ratio with its bootstrap interval, Wilson intervals, the sign test, the seed count from a
pilot, and the verdict an interval allows.

    primary_metric(evaluations)      -> mean Fréchet distance over the last LAST_EVALUATIONS
    stopped_primary(evaluations, steps) -> the same for a run that stopped on a non-finite
                                        value: each evaluation it did not reach scores the
                                        one-class row
    collapsed(run)                   -> bool: the declared collapse event
    paired_ratio(a, b, resamples, seed) -> (ratio, low, high): geometric mean of a / b, 95 % CI
    wilson(k, n)                     -> (low, high) 95 % interval of a proportion k / n
    sign_test(b, c)                  -> two-sided exact p of b against c discordant pairs
    seeds_needed(s)                  -> seeds that detect RATIO at POWER given the sd s of log
                                        paired differences (at least MIN_SEEDS)
    detectable_ratio(s, n)           -> the ratio n seeds detect at POWER
    verdict(low, high)               -> "lower", "higher" or "no measurable difference"
"""

import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import Any

import numpy as np

from benchmarks.exactness.report import MIN_CLASSES, ONE_CLASS_FRECHET

LAST_EVALUATIONS = 3  # the primary metric averages the run's last this many evaluations
MIN_SEEDS = 10
RATIO = 1.25  # the Fréchet ratio the study is sized to detect
POWER = 0.8
ALPHA = 0.05
# A collapse: fewer than MIN_CLASSES classes at the final evaluation, or a Fréchet distance at
# or past the calibration's one-class row (the first study's criterion, kept).


def primary_metric(evaluations: Sequence[dict[str, Any]]) -> float:
    """The mean ``frechet_distance`` of the last :data:`LAST_EVALUATIONS` of ``evaluations``
    (a run's evaluated metrics.jsonl lines, in step order); ValueError for fewer."""
    if len(evaluations) < LAST_EVALUATIONS:
        raise ValueError(
            f"the primary metric needs {LAST_EVALUATIONS} evaluations, the run has "
            f"{len(evaluations)}"
        )
    return float(np.mean([e["frechet_distance"] for e in evaluations[-LAST_EVALUATIONS:]]))


def stopped_primary(evaluations: Sequence[dict[str, Any]], steps: Sequence[int]) -> float:
    """The primary metric of a run that stopped on a non-finite value before its last
    evaluation: ``steps`` are every step the run was to evaluate, and each one it did not reach
    scores :data:`ONE_CLASS_FRECHET`, the least a collapse can score, so that the collapse counts
    as a worse result in the paired ratio rather than a missing one (docs/study.md,
    "Amendments")."""
    reached = {e["step"]: e["frechet_distance"] for e in evaluations}
    last = sorted(steps)[-LAST_EVALUATIONS:]
    return float(np.mean([reached.get(step, ONE_CLASS_FRECHET) for step in last]))


def collapsed(run: dict[str, Any]) -> bool:
    """The declared collapse: a non-finite stop (``nonfinite`` set), or a final evaluation with
    fewer than :data:`MIN_CLASSES` classes or a Fréchet distance at or past the one-class row."""
    if run.get("nonfinite"):
        return True
    final = run["evaluations"][-1]
    return bool(
        final["classes_covered"] < MIN_CLASSES or not final["frechet_distance"] < ONE_CLASS_FRECHET
    )


def paired_ratio(
    a: Sequence[float] | np.ndarray,
    b: Sequence[float] | np.ndarray,
    resamples: int = 10_000,
    seed: int = 0,
) -> tuple[float, float, float]:
    """(ratio, low, high): the geometric mean over pairs of ``a[i] / b[i]`` and its 95 %
    percentile bootstrap interval (``resamples`` draws of the pairs with replacement, numpy
    generator ``seed``). ValueError for unequal lengths, fewer than 2 pairs or a value <= 0."""
    a_arr, b_arr = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a_arr.shape != b_arr.shape or a_arr.ndim != 1 or len(a_arr) < 2:
        raise ValueError(f"paired_ratio needs two equal lists of >= 2 values, got {a} and {b}")
    if np.any(a_arr <= 0) or np.any(b_arr <= 0):
        raise ValueError("paired_ratio takes positive values (Fréchet distances)")
    logs = np.log(a_arr) - np.log(b_arr)
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(logs), (resamples, len(logs)))
    means = logs[draws].mean(axis=1)
    low, high = np.percentile(means, [100 * ALPHA / 2, 100 * (1 - ALPHA / 2)])
    return float(np.exp(logs.mean())), float(np.exp(low)), float(np.exp(high))


def wilson(k: int, n: int) -> tuple[float, float]:
    """The 95 % Wilson score interval of the proportion ``k / n`` (n >= 1)."""
    if not 0 <= k <= n or n < 1:
        raise ValueError(f"wilson needs 0 <= k <= n and n >= 1, got k={k}, n={n}")
    z = NormalDist().inv_cdf(1 - ALPHA / 2)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def sign_test(b: int, c: int) -> float:
    """Two-sided exact binomial p of ``b`` pairs one way against ``c`` the other (McNemar's
    exact test on the discordant pairs); 1.0 when there are none."""
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2**n
    return min(1.0, 2 * tail)


def _z_sum() -> float:
    return NormalDist().inv_cdf(1 - ALPHA / 2) + NormalDist().inv_cdf(POWER)


def seeds_needed(s: float) -> int:
    """Paired seeds that detect a :data:`RATIO` at :data:`POWER` (two-sided :data:`ALPHA`)
    when the paired log differences have standard deviation ``s``; at least MIN_SEEDS."""
    return max(MIN_SEEDS, math.ceil((_z_sum() * s / math.log(RATIO)) ** 2))


def detectable_ratio(s: float, n: int) -> float:
    """The ratio that ``n`` paired seeds detect at :data:`POWER` when the paired log
    differences have standard deviation ``s``."""
    return math.exp(_z_sum() * s / math.sqrt(n))


def verdict(low: float, high: float) -> str:
    """What a ratio interval (first arm over second) allows: "lower" when it lies below 1,
    "higher" above 1, else "no measurable difference"."""
    if high < 1.0:
        return "lower"
    if low > 1.0:
        return "higher"
    return "no measurable difference"


__all__ = [
    "LAST_EVALUATIONS",
    "MIN_SEEDS",
    "ONE_CLASS_FRECHET",
    "RATIO",
    "collapsed",
    "detectable_ratio",
    "paired_ratio",
    "primary_metric",
    "seeds_needed",
    "sign_test",
    "stopped_primary",
    "verdict",
    "wilson",
]
