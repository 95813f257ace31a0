"""The exactness study's blocks for ``benchmarks.published``: each renders a page's quoted
figures from benchmarks/results/exactness/ (and the check's from training/check_isa.json).

    study(critic)(results)   the rows over their seeds: collapses, final quality, steps, time
    steptime(critic)(results)  each row's CPU seconds per step, measured alone
    compiled(results)        each row's step compiled for one v5e chip: flops and bytes
    sigma(results)           approximate against exact R1 on trained critics, by sigma
    check_isa(results)       the sentence of docs/trainer.md on the check's measured differences
"""

import json
import pathlib

from benchmarks.exactness.report import summary_table
from benchmarks.tables import markdown_table

DASH = "\N{EN DASH}"
UNIT_ROUNDOFF = 2.0**-24  # float32's


def _load(results, name):
    return json.loads((pathlib.Path(results.dir) / name).read_text())


def _span(values, fmt):
    """The values' one figure if they all round alike, else the lowest and highest with a dash."""
    low, high = fmt.format(min(values)), fmt.format(max(values))
    return low if low == high else f"{low}{DASH}{high}"


def study(critic):
    """The block of ``study_<critic>.json``."""
    return lambda results: summary_table(_load(results, f"exactness/study_{critic}.json"))


def steptime_table(runs):
    """Each row's seconds per step (the fastest repeat), over the first row's, and iterations."""
    first = runs[0]
    rows = (
        [
            r["row"],
            f"{r['s_per_step']:.3f}",
            f"{r['s_per_step'] / first['s_per_step']:.2f}x",
            r["iterations"],
        ]
        for r in runs
    )
    return markdown_table(["row", "s / step", f"/ {first['row']}", "iterations"], rows)


def steptime(critic):
    """The block of ``steptime_<critic>.json``."""
    return lambda results: steptime_table(
        _load(results, f"exactness/steptime_{critic}.json")["runs"]
    )


def compiled(results):
    """Each row's step compiled for one v5e chip: flops and bytes, and over r3gan's, per tokens."""
    rows = _load(results, "exactness/compiled.json")["rows"]
    base = {r["tokens"]: r["step"] for r in rows if r["row"] == "r3gan"}
    cells = (
        [
            r["row"],
            r["tokens"],
            f"{r['step']['flops'] / 1e9:.1f}",
            f"{r['step']['flops'] / base[r['tokens']]['flops']:.3f}x",
            f"{r['step']['bytes'] / 1e9:.2f}",
            f"{r['step']['bytes'] / base[r['tokens']]['bytes']:.3f}x",
        ]
        for r in sorted(rows, key=lambda r: r["tokens"])
        if "step" in r
    )
    head = ["row", "tokens", "GFLOP / step", "/ r3gan", "GB / step", "/ r3gan"]
    return markdown_table(head, cells)


def sigma_table(result):
    """Per trained critic and sigma: the value ratio and the gradient cosine, one draw and the
    mean of the draws."""
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


def sigma(results):
    return sigma_table(_load(results, "exactness/sigma.json"))


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
