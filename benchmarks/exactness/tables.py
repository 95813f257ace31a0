"""The exactness study's blocks for ``benchmarks.published``: each renders a page's quoted
figures from benchmarks/results/exactness/ (and the check's from training/check_isa.json).

    study(critic)(results)   the rows over their seeds: collapses, final quality, steps, time
    steptime(critic)(results)  each row's CPU seconds per step, measured alone
    sigma(results)           approximate against exact R1 on trained critics, by sigma
    check_isa(results)       the sentence of docs/trainer.md on the check's measured differences
"""

import json
import pathlib

import numpy as np

from benchmarks.exactness.report import summarize
from benchmarks.tables import markdown_table

PM = "\N{PLUS-MINUS SIGN}"
UNIT_ROUNDOFF = 2.0**-24  # float32's


def _load(results, name):
    return json.loads((pathlib.Path(results.dir) / name).read_text())


def _mean_sd(values, fmt="{:.3f}"):
    if not values:
        return "-"
    if len(values) == 1:
        return fmt.format(values[0])
    return f"{fmt.format(np.mean(values))} {PM} {fmt.format(np.std(values))}"


def study(critic):
    """The block of ``study_<critic>.json``."""

    def render(results):
        result = _load(results, f"exactness/study_{critic}.json")
        rows = (
            [
                s["row"],
                f"{s['collapsed']} of {s['runs']}",
                _mean_sd(s["c2st"]),
                _mean_sd(s["frechet"], "{:.1f}"),
                _mean_sd([float(c) for c in s["classes"]], "{:.1f}"),
                _mean_sd([float(n) for n in s["steps"]], "{:.0f}"),
                _mean_sd(s["s_per_step"], "{:.2f}"),
            ]
            for s in summarize(result)
        )
        head = ["row", "collapsed", "C2ST", "Fréchet", "classes", "steps in budget", "s / step"]
        return markdown_table(head, rows)

    return render


def steptime(critic):
    """The block of ``steptime_<critic>.json``: each row's seconds per step, and over the first."""

    def render(results):
        runs = _load(results, f"exactness/steptime_{critic}.json")["runs"]
        first = runs[0]
        rows = (
            [r["row"], f"{r['s_per_step']:.3f}", f"{r['s_per_step'] / first['s_per_step']:.2f}x"]
            for r in runs
        )
        return markdown_table(["row", "s / step", f"/ {first['row']}"], rows)

    return render


def sigma(results):
    result = _load(results, "exactness/sigma.json")
    rows = (
        [
            r["run"],
            f"{r['sigma']:g}",
            f"{r['ratio_one_draw']:.3f}",
            f"{r['ratio_mean']:.3f}",
            f"{r['cosine_one_draw']:.3f}",
            f"{r['cosine_mean']:.3f}",
        ]
        for r in result["rows"]
    )
    mean = f"mean of {result['draws']} draws"
    head = ["trained critic", "sigma", "value ratio, 1 draw", mean, "gradient cosine, 1 draw", mean]
    return markdown_table(head, rows)


def check_isa(results):
    runs = _load(results, "training/check_isa.json")["runs"]
    one_step = [v for r in runs for k, v in r["max_rel_diff"].items() if not k.startswith("run_")]
    updates = [r["max_rel_diff"]["run_updates"] for r in runs]
    verdicts = sum(r["ok"] for r in runs)
    worst = max(one_step)
    return (
        f"{verdicts} of {len(runs)} cells say ok, the largest one-step difference is "
        f"{worst:.1e} ({worst / UNIT_ROUNDOFF:.0f}u), and one iteration's updates differ by at "
        f"most {max(updates):.1e}"
    )
