"""The declared study's quality curves (docs/study.md, "Analysis and report"): each arm's Fréchet
distance against step, and against CPU time from each arm's step time measured alone.

    curves(result)                  -> {arm: Curve(steps, centre, low, high, seeds)}
    minutes(curve, s_per_step)      -> the curve's steps as minutes of one CPU device
    step_times(testbed)             -> {arm: seconds per step} from steptime_declared_<testbed>
                                       (benchmarks.exactness.steptime --declared), or None
    table(result, s_per_step)       -> markdown lines: per evaluation step, each arm's curve
    figure(result, s_per_step, path)   two panels, Fréchet against step and against minutes

An arm's curve at a step is the geometric mean over the seeds that evaluated that step (a run
that stopped early drops out of the later steps; ``seeds`` says how many are left), with the
smallest and largest seed as its band. Time is ``step x s_per_step``: the runs' own clocks were
read on a machine that did other work beside them, so they are never used.
"""

import json
import pathlib
from typing import Any, NamedTuple

import numpy as np

import benchmarks
from benchmarks.tables import markdown_table

RESULTS = benchmarks.RESULTS / "exactness"


class Curve(NamedTuple):
    """One arm's Fréchet distance over seeds at each evaluated step (arrays of one length)."""

    steps: np.ndarray
    centre: np.ndarray  # geometric mean over seeds
    low: np.ndarray  # the best seed
    high: np.ndarray  # the worst seed
    seeds: np.ndarray  # how many seeds evaluated the step


def curves(result: dict[str, Any]) -> dict[str, Curve]:
    """Each arm of ``result`` (a declared_<testbed>.json) with its curve over its seeds, in the
    order the arms first appear."""
    by_arm: dict[str, dict[int, list[float]]] = {}
    for run in result["runs"]:
        points = by_arm.setdefault(run["arm"], {})
        for e in run["evaluations"]:
            points.setdefault(e["step"], []).append(e["frechet_distance"])
    out = {}
    for arm, points in by_arm.items():
        steps = sorted(points)
        logs = [np.log(points[s]) for s in steps]
        out[arm] = Curve(
            steps=np.asarray(steps),
            centre=np.exp([v.mean() for v in logs]),
            low=np.asarray([min(points[s]) for s in steps]),
            high=np.asarray([max(points[s]) for s in steps]),
            seeds=np.asarray([len(points[s]) for s in steps]),
        )
    return out


def minutes(curve: Curve, s_per_step: float) -> np.ndarray:
    """The curve's steps as minutes of one CPU device at ``s_per_step``."""
    return curve.steps * s_per_step / 60.0


def step_times(testbed: str, results: pathlib.Path = RESULTS) -> dict[str, float] | None:
    """Each arm's seconds per step on ``testbed``, measured alone
    (``python -m benchmarks.exactness.steptime --declared TESTBED``); None before it is."""
    path = results / f"steptime_declared_{testbed}.json"
    if not path.exists():
        return None
    return {row["row"]: row["s_per_step"] for row in json.loads(path.read_text())["runs"]}


def table(result: dict[str, Any], s_per_step: dict[str, float] | None) -> list[str]:
    """Per evaluated step, each arm's geometric-mean Fréchet distance with its seed range and,
    where its step time is measured, the minutes it took to get there."""
    arm_curves = curves(result)
    steps = sorted({int(s) for c in arm_curves.values() for s in c.steps})
    head = ["step", *arm_curves]
    lines = []
    for step in steps:
        cells: list[Any] = [step]
        for arm, c in arm_curves.items():
            where = np.flatnonzero(c.steps == step)
            if not len(where):
                cells.append("—")
                continue
            i = where[0]
            cell = f"{c.centre[i]:.1f} ({c.low[i]:.1f} to {c.high[i]:.1f}, {c.seeds[i]} seeds)"
            if s_per_step is not None and arm in s_per_step:
                cell += f", {step * s_per_step[arm] / 60:.1f} min"
            cells.append(cell)
        lines.append(cells)
    return markdown_table(head, lines)


def figure(
    result: dict[str, Any], s_per_step: dict[str, float] | None, path: pathlib.Path
) -> pathlib.Path:
    """Fréchet distance (log scale) per arm against step and, with ``s_per_step``, against
    minutes of one CPU device: the geometric mean over seeds as a line, the seeds' range as a
    band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 1 if s_per_step is None else 2
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4.2), squeeze=False)
    for i, (arm, c) in enumerate(curves(result).items()):
        xs = [("step", c.steps)]
        if s_per_step is not None and arm in s_per_step:
            xs.append(
                (
                    "minutes of one CPU device (steps x the arm's step time alone)",
                    minutes(c, s_per_step[arm]),
                )
            )
        for ax, (label, x) in zip(axes[0], xs, strict=False):
            ax.plot(x, c.centre, color=f"C{i}", label=f"{arm} ({int(c.seeds.max())} seeds)")
            ax.fill_between(x, c.low, c.high, color=f"C{i}", alpha=0.15)
            ax.set_xlabel(label)
    for ax in axes[0]:
        ax.set_yscale("log")
        ax.set_ylabel("Fréchet distance (lower is better)")
        ax.legend(fontsize=8)
    axes[0][0].set_title(f"{result['testbed']}: geometric mean over seeds, band: best to worst")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


__all__ = ["Curve", "curves", "figure", "minutes", "step_times", "table"]
