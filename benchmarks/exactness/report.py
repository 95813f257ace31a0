"""The study's page and figure: rows over seeds, the runs, and quality against CPU time.

summarize(result)        -> [{"row", "recorded", "runs", "collapsed", c2st/fd, s_per_step}]
    by_row(summary)          -> {row: its summary}; ValueError where a row was recorded both ways
    summary_table(result)    -> the markdown lines of the rows over their seeds
markdown(result)         -> the page of benchmarks/results/exactness/study_<critic>.md
figure(result, path)     -> Frechet distance against the study's clock, one line per run

A run recorded before runs kept their resolved configuration and commit (no ``config``) is never
pooled with one that keeps them: its row is summarised apart and marked (``UNRECORDED``), with a
note under the table.
"""

import pathlib
from typing import Any

import numpy as np

from benchmarks.tables import markdown_table

MIN_CLASSES = 8
# The mark of a row whose runs were recorded without their resolved configuration.
UNRECORDED = "\N{DAGGER}"


def unrecorded_note(runs: int) -> str:
    """The note under a table whose marked rows hold ``runs`` runs without a configuration."""
    return (
        f"{UNRECORDED} {runs} run{'s' if runs != 1 else ''} recorded without their resolved "
        "configuration and commit: what they trained is not checked against their row's "
        "declaration, and their flags alone do not fix it (a recipe of their commit may have set "
        "fields the flags do not name)."
    )


# The MNIST calibration's "real, one class (3)" row: every sample one digit.
ONE_CLASS_FRECHET = 181.9


def collapsed(run: dict[str, Any]) -> bool:
    """A failed run, or final samples covering fewer than ``MIN_CLASSES`` classes or as far
    from the digits as one class alone (the study's stated criterion)."""
    if run.get("failed"):
        return True
    return run["classes_covered"] < MIN_CLASSES or run["frechet_distance"] > ONE_CLASS_FRECHET


def recorded(run: dict[str, Any]) -> bool:
    """Whether ``run`` keeps its resolved configuration (and commit)."""
    return "config" in run


def summarize(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One record per row, in the order rows first appear, its runs with a resolved
    configuration apart from those without (``recorded``): how many runs and collapses, and the
    final quality of its runs that did not fail (mean and sd over seeds)."""
    groups: dict[tuple[str, bool], list[dict[str, Any]]] = {}
    for run in result["runs"]:
        groups.setdefault((run["row"], recorded(run)), []).append(run)
    summary = []
    for (row, kept), runs in groups.items():
        done = [r for r in runs if not r.get("failed")]
        summary.append(
            {
                "row": row,
                "recorded": kept,
                "runs": len(runs),
                "collapsed": sum(collapsed(r) for r in runs),
                "c2st": [r["c2st_accuracy"] for r in done],
                "frechet": [r["frechet_distance"] for r in done],
                "classes": [r["classes_covered"] for r in done],
                "steps": [r["steps"] for r in done],
                "s_per_step": [r["s_per_step"] for r in done],
            }
        )
    return summary


def by_row(summary: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The summaries by row name; ValueError where a row has runs with and without a resolved
    configuration (two summaries that must not be read as one)."""
    rows: dict[str, dict[str, Any]] = {}
    for s in summary:
        if s["row"] in rows:
            raise ValueError(
                f"row {s['row']} holds runs with and without a resolved configuration; they "
                "are summarised apart, not as one row"
            )
        rows[s["row"]] = s
    return rows


def mean_sd(values: list[float], fmt: str = "{:.3f}") -> str:
    """The values' mean and standard deviation over seeds (the value alone for one seed)."""
    if not values:
        return "-"
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(np.mean(values))} ± {fmt.format(np.std(values))}"


def summary_table(result: dict[str, Any]) -> list[str]:
    """The rows over their seeds: collapses, final quality, steps in the budget, s / step; a
    row of runs without their resolved configuration marked, with a note under the table."""
    summary = summarize(result)
    rows = (
        [
            s["row"] if s["recorded"] else f"{s['row']} {UNRECORDED}",
            f"{s['collapsed']} of {s['runs']}",
            mean_sd(s["c2st"]),
            mean_sd(s["frechet"], "{:.1f}"),
            mean_sd([float(c) for c in s["classes"]], "{:.1f}"),
            mean_sd([float(n) for n in s["steps"]], "{:.0f}"),
            mean_sd(s["s_per_step"], "{:.2f}"),
        ]
        for s in summary
    )
    head = ["row", "collapsed", "C2ST", "Fréchet", "classes", "steps in budget", "s / step"]
    table = markdown_table(head, rows)
    unrecorded = sum(s["runs"] for s in summary if not s["recorded"])
    return [*table, "", unrecorded_note(unrecorded)] if unrecorded else table


def _commit(run: dict[str, Any]) -> str:
    """A run's commit as the page shows it: short, "dirty" where the checkout was changed."""
    if not recorded(run):
        return "not recorded"
    commit = run["commit"] if run["commit"] == "unknown" else run["commit"][:9]
    return f"{commit} (dirty)" if run["dirty"] else commit


def markdown(result: dict[str, Any]) -> str:
    script = "JAX_PLATFORMS=cpu python -m benchmarks.exactness.study"
    command = "`, then `".join(" ".join([script, *argv]) for argv in result["invocations"])
    runs = (
        [
            r["row"],
            r["seed"],
            r.get("steps", "-"),
            "failed" if r.get("failed") else f"{r['c2st_accuracy']:.3f}",
            "-" if r.get("failed") else f"{r['frechet_distance']:.2f}",
            "-" if r.get("failed") else r["classes_covered"],
            "yes" if collapsed(r) else "no",
            _commit(r),
            " ".join(r["flags"][8:]),
        ]
        for r in result["runs"]
    )
    # Older files carry one commit, their last invocation's; newer ones one per run.
    commit = f"; commit {result['commit']} (the last invocation's)" if "commit" in result else ""
    budget = {r.get("budget_s") for r in result["runs"]}
    lines = [
        "# What exactness buys: exact against approximate R1 in training",
        "",
        (
            f"Generated by `{command}`: one `fastgp train --dataset mnist` per run, of as many "
            f"steps as its row takes in {', '.join(f'{b:g} s' for b in sorted(budget) if b)} "
            "on one CPU device (steptime_*.md). Final quality of each row over its seeds "
            "(mean ± sd):"
        ),
        "",
        *summary_table(result),
        "",
        "Every run:",
        "",
        *markdown_table(
            ["row", "seed", "steps", "C2ST", "Fréchet", "classes", "collapsed", "commit", "flags"],
            runs,
        ),
        "",
        f"Machine: {result['machine']}{commit}.",
        "",
    ]
    return "\n".join(lines)


def figure(result: dict[str, Any], path: pathlib.Path) -> None:
    """Fréchet distance (the classifier-feature FD) against the study's clock (steps x the
    row's time per step), one line per run, one
    colour per row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    colours: dict[str, str] = {}
    for run in result["runs"]:
        curve = run.get("curve") or []
        if not curve:
            continue
        row = run["row"]
        first = row not in colours
        colour = colours.setdefault(row, f"C{len(colours)}")
        ax.plot(
            [p["seconds"] for p in curve],
            [p["frechet_distance"] for p in curve],
            color=colour,
            alpha=0.8,
            label=row if first else None,
        )
    ax.set_xlabel("seconds of one CPU device: steps x the row's time per step")
    ax.set_ylabel("Fréchet distance (lower is better)")
    ax.set_yscale("log")
    if colours:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
