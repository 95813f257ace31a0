"""The declared study's report (docs/study.md, "Analysis and report"), from its results files.

    comparison_rows(results)  -> one dict per comparison with paired seeds in ``results``
                                 (testbed -> the declared_<testbed>.json contents)
    markdown(results)         -> the comparisons' table lines
    answer(results)           -> README's sentence: the primary comparisons' findings in words,
                                 each saying only what its interval allows (or how many seeds
                                 are in while fewer than 10)
    page(results, directory)  -> declared.md's lines: the comparisons, then per testbed its
                                 curves (figure drawn into ``directory``) and, once measured,
                                 the gradient cosine along its critics

A comparison's seeds are those where both arms recorded a primary metric. Per arm: the mean and
standard deviation of the primary metric and the collapses with their Wilson interval; per pair:
the geometric-mean ratio first / second with its bootstrap interval, the same over the pairs
where neither collapsed, the sign test on the discordant collapses, the verdict the interval
allows, and the ratio the seeds could detect at the declared power given the pairs' spread.
A comparison with fewer than ``analysis.MIN_SEEDS`` pairs is marked unpowered: its interval is
shown, no verdict is drawn.
"""

import json
import math
import pathlib
from typing import Any

import numpy as np

from benchmarks.exactness import analysis, declared_cosine, declared_curves, design
from benchmarks.tables import markdown_table


def _pairs(result: dict[str, Any], first: str, second: str) -> list[tuple[dict, dict]]:
    by = {(r["arm"], r["seed"]): r for r in result["runs"] if "primary" in r}
    seeds = sorted({s for a, s in by if a == first} & {s for a, s in by if a == second})
    return [(by[first, s], by[second, s]) for s in seeds]


def comparison_rows(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Each declared comparison with at least 2 paired seeds in ``results``, analysed."""
    rows = []
    for c in design.COMPARISONS:
        pairs = _pairs(results.get(c.testbed, {"runs": []}), c.first, c.second)
        if len(pairs) < 2:
            continue
        a = [p[0]["primary"] for p in pairs]
        b = [p[1]["primary"] for p in pairs]
        ratio, low, high = analysis.paired_ratio(a, b)
        kept = [(x, y) for x, y in pairs if not (x["collapsed"] or y["collapsed"])]
        clean = (
            analysis.paired_ratio([x["primary"] for x, _ in kept], [y["primary"] for _, y in kept])
            if len(kept) >= 2
            else None
        )
        collapsed = [sum(p[i]["collapsed"] for p in pairs) for i in (0, 1)]
        only_first = sum(x["collapsed"] and not y["collapsed"] for x, y in pairs)
        only_second = sum(y["collapsed"] and not x["collapsed"] for x, y in pairs)
        sd = float(np.std(np.log(a) - np.log(b), ddof=1))
        powered = len(pairs) >= analysis.MIN_SEEDS
        rows.append(
            {
                "comparison": c.name,
                "testbed": c.testbed,
                "first": c.first,
                "second": c.second,
                "seeds": len(pairs),
                "mean": (float(np.mean(a)), float(np.mean(b))),
                "sd": (float(np.std(a, ddof=1)), float(np.std(b, ddof=1))),
                "ratio": (ratio, low, high),
                "ratio_without_collapses": clean,
                "collapsed": collapsed,
                "wilson": [analysis.wilson(k, len(pairs)) for k in collapsed],
                "sign_test_p": analysis.sign_test(only_first, only_second),
                "detectable_ratio": analysis.detectable_ratio(sd, len(pairs)),
                "verdict": analysis.verdict(low, high) if powered else "unpowered",
            }
        )
    return rows


def _interval(triple: tuple[float, float, float] | None) -> str:
    if triple is None:
        return "—"
    ratio, low, high = triple
    return f"{ratio:.2f} ({low:.2f} to {high:.2f})"


def _rate(k: int, n: int, interval: tuple[float, float]) -> str:
    return f"{k} of {n} ({interval[0]:.2f} to {interval[1]:.2f})"


def markdown(results: dict[str, dict[str, Any]]) -> list[str]:
    """The report's table: one line per analysed comparison."""
    head = ["comparison", "arms", "seeds", "Fréchet, first", "Fréchet, second"]
    head += ["ratio (95 % CI)", "without collapses", "collapsed, first", "collapsed, second"]
    head += ["sign test p", "detectable", "verdict"]
    lines = []
    for r in comparison_rows(results):
        n = r["seeds"]
        lines.append(
            [
                f"{r['comparison']} ({r['testbed']})",
                f"{r['first']} / {r['second']}",
                n,
                *(f"{m:.1f} ± {s:.1f}" for m, s in zip(r["mean"], r["sd"], strict=True)),
                _interval(r["ratio"]),
                _interval(r["ratio_without_collapses"]),
                *(_rate(k, n, w) for k, w in zip(r["collapsed"], r["wilson"], strict=True)),
                f"{r['sign_test_p']:.2f}",
                f"{r['detectable_ratio']:.2f}x" if math.isfinite(r["detectable_ratio"]) else "—",
                r["verdict"],
            ]
        )
    return markdown_table(head, lines)


def _arm_name(arm: str) -> str:
    if arm == "exact":
        return "exact R1"
    sigma = arm.removeprefix("approx-")
    return f"approximate R1 at \N{GREEK SMALL LETTER SIGMA} = {sigma}"


def _finding(row: dict[str, Any]) -> str:
    """One comparison's result in words: its ratio and interval, and only what they allow."""
    ratio, low, high = row["ratio"]
    first, second = _arm_name(row["first"]), _arm_name(row["second"])
    measured = (
        f"{first}'s Fréchet distance is {ratio:.2f}x that of {second} (95 % interval {low:.2f} to "
        f"{high:.2f}, {row['seeds']} paired seeds)"
    )
    if row["verdict"] == "lower":
        return f"{measured}: exact R1 trained better generators, by that interval"
    if row["verdict"] == "higher":
        return f"{measured}: the approximation trained better generators, by that interval"
    if row["verdict"] == "unpowered":
        return f"{measured}, too few seeds for a verdict"
    return (
        f"{measured}: no measurable difference at this power (a ratio of "
        f"{row['detectable_ratio']:.2f}x would have been seen 80 % of the time)"
    )


def answer(results: dict[str, dict[str, Any]]) -> str:
    """README's answer: the primary comparisons' findings, or how far the study has got."""
    rows = [r for r in comparison_rows(results) if r["comparison"].startswith("P")]
    if not rows or all(r["verdict"] == "unpowered" for r in rows):
        primary = [c for c in design.COMPARISONS if c.name.startswith("P")]
        result = results.get(primary[0].testbed, {"runs": []})
        seeds = min(len(_pairs(result, c.first, c.second)) for c in primary)
        return (
            f"Not known yet: the declared study has {seeds} of the at least "
            f"{analysis.MIN_SEEDS} paired seeds its primary comparisons need before they draw a "
            "verdict, and fastgp gives no advice until they do"
        )
    findings = "; ".join(_finding(r) for r in rows)
    return f"On the ViT critic trained on MNIST, {findings}"


def _curves(testbed: str, result: dict[str, Any], directory: pathlib.Path) -> list[str]:
    s_per_step = declared_curves.step_times(testbed, directory)
    figure = declared_curves.figure(result, s_per_step, directory / f"declared_{testbed}.png")
    timed = (
        "minutes of one CPU device: the step times measured alone in "
        f"steptime_declared_{testbed}.md"
        if s_per_step
        else "no minutes yet: the step times alone are not measured "
        f"(`python -m benchmarks.exactness.steptime --declared {testbed}`)"
    )
    return [
        f"## {testbed}: quality along the runs",
        "",
        (
            "Each arm's Fréchet distance at each evaluation, the geometric mean over its seeds "
            f"(the best and worst seed), {timed}."
        ),
        "",
        *declared_curves.table(result, s_per_step),
        "",
        f"![{testbed}: Fréchet distance along the runs]({figure.name})",
        "",
    ]


def _cosine(testbed: str, directory: pathlib.Path) -> list[str]:
    path = directory / f"declared_cosine_{testbed}.json"
    if not path.exists():
        return []
    return [
        f"## {testbed}: the approximation's gradient along the trained critics",
        "",
        (
            "One draw of approximate R1 at weight 1/σ² against exact R1 at weight 1, on 64 "
            "held-out digits, at each checkpoint a run keeps (its last three evaluations): the "
            "cosine between their critic-parameter gradients and the ratio of their values, over "
            f"the seeds (`{path.name}`, `benchmarks.exactness.declared_cosine`)."
        ),
        "",
        *declared_cosine.table(json.loads(path.read_text())),
        "",
    ]


def page(results: dict[str, dict[str, Any]], directory: pathlib.Path) -> list[str]:
    """declared.md: how it was made, the comparisons' table, then each testbed's curves and
    gradient cosines; the curves' figures are drawn into ``directory``."""
    counts = "; ".join(f"{t}: {len(r['runs'])} runs" for t, r in results.items())
    lines = [
        "# The declared exactness study: its runs so far",
        "",
        (
            "Generated by `python -m benchmarks.exactness.declared report` from "
            "`declared_<testbed>.json`; the design is docs/study.md. Recorded: "
            f"{counts or 'nothing yet'}. A comparison appears once 2 seeds of both its arms are "
            "in; with fewer than 10 it is unpowered and draws no verdict."
        ),
        "",
        *markdown(results),
        "",
    ]
    for testbed, result in results.items():
        lines += _curves(testbed, result, directory) + _cosine(testbed, directory)
    return lines


__all__ = ["answer", "comparison_rows", "markdown", "page"]
