"""The tables docs/performance.md quotes about approximate_r1, rendered from
benchmarks/results/approximate_r1/.

Each function takes ``benchmarks.published.Results`` and returns the table's lines:

    ratios(results)     approximate_r1.json: ratio to sigma^2 R1 per critic, training and sigma
    cost(results)       approximate_r1.json (CPU times), approximate_r1_tpu.json (v5e compiles)
    gradients(results)  approximate_r1_gradients.json: the mean gradient against exact R1's
    training(results)   approximate_r1_training.json: quality and time per penalty and seed
"""

import json
import pathlib
import statistics

from benchmarks.tables import markdown_table

PM = "\N{PLUS-MINUS SIGN}"
STUDY = "approximate_r1"  # the results' folder under the results directory


def _load(results, name):
    return json.loads((pathlib.Path(results.dir) / STUDY / name).read_text())


def ratios(results):
    """critic, trained steps, sigma: the mean ratio with its standard error and one draw's std."""
    rows = [
        [
            f"{r['critic']} ({r['batch']})",
            str(r.get("train_steps", 0)),
            f"{r['sigma']:g}",
            f"{r['mean']:.3f} {PM} {r['standard_error']:.3f}",
            f"{r['std']:.2f}",
        ]
        for r in _load(results, "approximate_r1.json")["ratios"]
    ]
    head = ["critic (batch)", "trained steps", "sigma", "mean ratio", "std of one draw"]
    return markdown_table(head, rows)


def _ratio(a, b):
    return f"{a / b:.2f}x"


def cost(results):
    """Per critic: the CPU step time and the v5e compiled figures of approximate over exact R1."""
    cpu = {r["critic"]: r for r in _load(results, "approximate_r1.json")["times"]}
    compiled = _load(results, "approximate_r1_tpu.json")
    capacity = _load(results, "approximate_r1_tpu_capacity.json")

    def tpu(critic, variant):
        found = [
            r
            for r in compiled
            if (r["generation"], r["critic"], r["variant"]) == ("v5e", critic, variant)
            and r["fits"]
        ]
        return min(found, key=lambda r: r["batch"])

    rows = []
    for critic in dict.fromkeys([*cpu, *(r["critic"] for r in compiled)]):
        time = cpu.get(critic)
        exact, approximate = tpu(critic, "exact-r1"), tpu(critic, "approximate-r1")
        fits = capacity.get(critic, {})
        rows.append(
            [
                critic,
                "-" if time is None else _ratio(time["approximate-r1"], time["exact-r1"]),
                str(exact["batch"]),
                _ratio(approximate["flops"], exact["flops"]),
                _ratio(approximate["bytes"], exact["bytes"]),
                _ratio(approximate["peak"], exact["peak"]),
                str(fits.get("exact-r1", "-")),
                str(fits.get("approximate-r1", "-")),
            ]
        )
    head = [
        *("critic", "CPU step time", "v5e batch", "flops", "bytes", "peak"),
        *("fits (exact)", "fits (approximate)"),
    ]
    return markdown_table(head, rows)


def gradients(results):
    """activation, sigma: cosine and norm ratio of the mean approximate gradient to exact R1's."""
    rows = [
        [
            r["activation"],
            f"{r['sigma']:g}",
            f"{r['cosine']:.3f}",
            f"{r['norm_ratio']:.2f}",
            f"{r['split_half_cosine']:.3f}",
        ]
        for r in _load(results, "approximate_r1_gradients.json")["rows"]
    ]
    head = ["activation", "sigma", "cosine", "norm ratio", "split-half cosine"]
    return markdown_table(head, rows)


def _quality(run):
    if "modes" in run:
        return f"{run['modes']}/{run['total_modes']}, {run['high_quality']:.0f} %"
    return f"{run['c2st_accuracy']:.3f}, {run['frechet_distance']:.2f}"


def training(results):
    """Per dataset, penalty and sigma: each seed's final quality and the median train_s."""
    groups: dict[tuple, list[dict]] = {}
    for run in _load(results, "approximate_r1_training.json")["runs"]:
        key = (run["dataset"], run["steps"], run["penalty"], run["sigma"], run["weight"])
        groups.setdefault(key, []).append(run)
    rows = []
    for (dataset, steps, penalty, sigma, weight), runs in groups.items():
        runs = sorted(runs, key=lambda r: r["seed"])
        rows.append(
            [
                f"{dataset} ({steps:,} steps)",
                penalty,
                "-" if sigma is None else f"{sigma:g}",
                f"{weight:g}",
                ", ".join(str(r["seed"]) for r in runs),
                "; ".join(_quality(r) for r in runs),
                f"{statistics.median(r['train_s'] for r in runs):.0f}",
            ]
        )
    head = ["data", "penalty", "sigma", "weight", "seeds", "quality per seed", "median train_s"]
    return markdown_table(head, rows)
