"""Render pytest-benchmark JSON as markdown tables and a PNG plot in benchmarks/results/suites/.

    pytest benchmarks --benchmark-only --benchmark-json benchmarks/results/suites/bench.json
    python -m benchmarks.suites.report [benchmarks/results/suites/bench.json]
    python -m benchmarks.suites.report --merge other.json   # first merge another run's groups in

bench.json becomes bench.md and bench.png; its critic-zoo groups (``zoo:*``,
``test_bench_zoo.py``) become results/zoo/zoo_cpu.md (``benchmarks.zoo.report``: step times,
ratios, the fastest path and the compiled programs' figures). ``--merge`` puts a run of some
suites only (the zoo, say) into bench.json in place of the groups it re-ran, recording its date
under ``merged_runs``.

Per group: median and interquartile range of one call, and the ratio of medians to the group's
baseline (the benchmark whose ``extra_info["baseline"]`` is true: the naive path, or the plain
critic step where the floor is the reference). ``lazy:*`` rows are 16 critic steps (dispatched
from Python) per call and also show the per-step time. Paired groups time their paths
interleaved; their tables give per-path medians and the median of per-round ratios.
"""

import json
import pathlib
import sys

import benchmarks
from benchmarks.suites.bench_json import kind_of, load
from benchmarks.tables import markdown_table

RESULTS = benchmarks.RESULTS / "suites"
ZOO_RESULTS = benchmarks.RESULTS / "zoo"  # zoo_cpu.md: the CPU zoo's groups of bench.json
ORDER = ["penalty", "step", "lazy", "remat", "smoke"]
TITLES = {
    "penalty": "Penalty value_and_grad wrt g on precomputed gradients (naive jnp vs fastgp XLA)",
    "step": "Whole critic step: plain (no penalty, the floor), naive, fastgp (ratio to naive)",
    "lazy": "Lazy regularisation, 16 critic steps per call from Python (ratio to 16 plain steps)",
    "remat": "Rematerialisation of the critic inside the penalty (ratio to naive)",
    "smoke": "Smoke only (Pallas interpret mode on CPU; not a speed claim)",
}


def fmt_time(seconds):
    if seconds >= 1:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"


def group_rows(benches):
    base = next((b for b in benches if b["extra_info"].get("baseline")), None)
    base_median = base["stats"]["median"] if base else None
    rows = []
    for b in benches:
        s, info = b["stats"], b["extra_info"]
        ratio = s["median"] / base_median if base_median else None
        rows.append(
            dict(
                path=info.get("path", b["name"]),
                median=s["median"],
                q1=s["q1"],
                q3=s["q3"],
                rounds=s["rounds"],
                iterations=s.get("iterations", 1),
                ratio=ratio,
                steps=info.get("steps_per_call"),
                load=info.get("loadavg_1m"),
                baseline=bool(info.get("baseline")),
            )
        )
    return rows


def paired_rows(bench):
    info = bench["extra_info"]
    base = info["baseline_path"]
    steps = info.get("steps_per_call") or 1
    also = info.get("also_vs")
    rows = []
    for path, median in info["median_s"].items():
        q1, q3 = info["iqr_s"][path]
        row = dict(
            path=path,
            baseline=path == base,
            median=median,
            q1=q1,
            q3=q3,
            per_step=median / steps,
            ratio=info["ratio_of_medians"][path],
            paired=info["paired_ratio"][path],
            rounds=len(info["samples_s"][path]),
        )
        if also:
            row["also"] = median / info["median_s"][also]
        rows.append(row)
    return rows


def _path(row):
    return f"{row['path']}{' (baseline)' if row['baseline'] else ''}"


def _iqr(row):
    return f"{fmt_time(row['q1'])} - {fmt_time(row['q3'])}"


def render_group(group, benches):
    lines = [f"**{group}**", ""]
    if benches[0]["extra_info"].get("path") == "paired":
        bench = benches[0]
        info = bench["extra_info"]
        base, also = info["baseline_path"], info.get("also_vs")
        per_step = bool(info.get("steps_per_call"))
        head = ["path", "median", "IQR", "rounds"]
        head += [("per step" if kind_of(group) == "lazy" else "per call")] if per_step else []
        head += [f"ratio to {base} (medians)", "median per-round ratio"]
        head += [f"ratio to {also}"] if also else []
        rows = []
        for r in paired_rows(bench):
            row = [_path(r), fmt_time(r["median"]), _iqr(r), r["rounds"]]
            row += [fmt_time(r["per_step"])] if per_step else []
            row += [f"{r['ratio']:.3f}x", f"{r['paired']:.3f}x"]
            row += [f"{r['also']:.3f}x"] if also else []
            rows.append(row)
        lines += markdown_table(head, rows)
        load = info.get("loadavg_1m")
        if load:
            lines += ["", f"1-minute load average at start / end: {load[0]:.1f} / {load[1]:.1f}"]
        return lines + [""]
    rows = []
    for r in group_rows(benches):
        ratio = f"{r['ratio']:.3f}x" if r["ratio"] is not None else "-"
        load = f"{r['load']:.1f}" if r["load"] is not None else "-"
        rows.append(
            [
                _path(r),
                fmt_time(r["median"]),
                _iqr(r),
                f"{r['rounds']} x {r['iterations']}",
                ratio,
                load,
            ]
        )
    head = ["path", "median", "IQR", "rounds x iters", "ratio", "load"]
    return [*lines, *markdown_table(head, rows), ""]


def render_penalty_summary(groups):
    """One compact table: fastgp XLA / naive median ratio per shape and dtype."""
    lines = []
    for group in sorted(
        (g for g in groups if kind_of(g) == "penalty"),
        key=lambda g: (g.split(":")[1], [int(v) for v in g.split(":")[2].split("x")]),
    ):
        rows = {r["path"]: r for r in paired_rows(groups[group][0])}
        if {"naive", "xla"} <= rows.keys():
            _, dtype, shape = group.split(":")
            lines.append(
                [
                    shape,
                    dtype,
                    fmt_time(rows["naive"]["per_step"]),
                    fmt_time(rows["xla"]["per_step"]),
                    f"{rows['xla']['ratio']:.3f}x",
                    f"{rows['xla']['paired']:.3f}x",
                ]
            )
    head = [
        "B x D",
        "dtype",
        "naive median",
        "fastgp xla median",
        "xla / naive (medians)",
        "median per-round ratio",
    ]
    return [*markdown_table(head, lines), ""]


def render_step_summary(groups):
    """One row per critic: medians of each path and fastgp's ratios to naive and to plain."""
    lines = []
    for group in sorted(g for g in groups if kind_of(g) == "step"):
        info = groups[group][0]["extra_info"]
        m = info["median_s"]
        if not {"plain", "naive", "fastgp", "fastgp reverse"} <= m.keys():
            continue
        lines.append(
            [
                f"{group.split(':', 1)[1]} ({info.get('batch', '?')})",
                *(fmt_time(m[p]) for p in ("plain", "naive", "fastgp", "fastgp reverse")),
                f"{m['fastgp'] / m['naive']:.3f}x",
                f"{m['fastgp'] / m['plain']:.3f}x",
                f"{m['fastgp reverse'] / m['naive']:.3f}x",
                f"{m['naive'] / m['plain']:.3f}x",
            ]
        )
    head = [
        "critic (batch)",
        "plain",
        "naive",
        "fastgp",
        "fastgp reverse",
        "fastgp / naive",
        "fastgp / plain",
        "fastgp reverse / naive",
        "naive / plain",
    ]
    return [*markdown_table(head, lines), ""]


def render(data, groups):
    m = data.get("machine_info", {})
    cpu = m.get("cpu", {})
    lines = [
        "# Benchmark results (CPU)",
        "",
        (
            f"Run {data.get('datetime', '?')}; {cpu.get('brand_raw', '?')}, "
            f"{cpu.get('count', '?')} logical CPUs, Python {m.get('python_version', '?')}. "
            "Medians of warm, jitted calls, each blocked until ready; ratios are ratios of medians "
            "within this one run. `load` is the 1-minute load average when the benchmark started "
            "(other processes share these cores)."
        ),
        "",
        *(
            [
                "The critic zoo (`benchmarks/zoo/critics.py`): [zoo_cpu.md](../zoo/zoo_cpu.md).",
                "",
            ]
            if any(kind_of(g) == "zoo" for g in groups)
            else []
        ),
        "## Summary: whole critic steps (ratios of medians)",
        "",
        *render_step_summary(groups),
        "## Summary: penalty on precomputed gradients",
        "",
        *render_penalty_summary(groups),
    ]
    for kind in ORDER:
        names = sorted(g for g in groups if kind_of(g) == kind)
        if not names:
            continue
        lines += [f"## {TITLES[kind]}", ""]
        for name in names:
            lines += render_group(name, groups[name])
    return "\n".join(lines)


def plot(groups, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    critic_groups = [
        g for k in ("step", "lazy", "remat") for g in sorted(groups) if kind_of(g) == k
    ]
    fig, (ax1, ax2) = plt.subplots(
        1, 2, figsize=(15, max(5, 0.32 * sum(len(groups[g]) for g in critic_groups)))
    )
    labels, ratios, colors = [], [], []
    palette = {"step": "tab:blue", "lazy": "tab:green", "remat": "tab:red"}
    for g in critic_groups:
        bench = groups[g][0]
        rows = (
            paired_rows(bench)
            if bench["extra_info"].get("path") == "paired"
            else group_rows(groups[g])
        )
        for r in rows:
            if r["ratio"] is None:
                continue
            labels.append(f"{g} | {r['path']}")
            ratios.append(r["ratio"])
            colors.append(palette[kind_of(g)])
    ax1.barh(range(len(ratios)), ratios, color=colors)
    ax1.set_yticks(range(len(ratios)), labels, fontsize=7)
    ax1.invert_yaxis()
    ax1.axvline(1.0, color="k", lw=0.8)
    ax1.set_xlabel("median time / group baseline")
    ax1.set_title("Critic-step groups (baseline: naive for step/remat, plain for others)")
    for dtype, marker in (("f32", "o"), ("bf16", "s")):
        xs, ys = [], []
        for g in sorted(
            (g for g in groups if g.startswith(f"penalty:{dtype}:")),
            key=lambda g: [int(v) for v in g.split(":")[2].split("x")],
        ):
            rows = {r["path"]: r for r in paired_rows(groups[g][0])}
            if "xla" in rows and rows["xla"]["ratio"] is not None:
                xs.append(g.split(":")[2])
                ys.append(rows["xla"]["ratio"])
        ax2.plot(xs, ys, marker=marker, label=dtype)
    ax2.axhline(1.0, color="k", lw=0.8)
    ax2.set_ylabel("fastgp xla / naive (median)")
    ax2.set_xlabel("B x D")
    ax2.set_title("Penalty value_and_grad on precomputed g")
    ax2.tick_params(axis="x", rotation=30)
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def merge(base_path, extra_path):
    """Put the benchmarks of another run (say, only test_bench_zoo.py) into ``base_path``'s JSON,
    replacing the groups it re-ran; the other run's date and machine go to ``merged_runs``."""
    base = json.loads(pathlib.Path(base_path).read_text())
    extra = json.loads(pathlib.Path(extra_path).read_text())
    replaced = {b["group"] for b in extra["benchmarks"]}
    base["benchmarks"] = [b for b in base["benchmarks"] if b["group"] not in replaced]
    base["benchmarks"] += extra["benchmarks"]
    runs = [r for r in base.get("merged_runs", []) if not replaced >= set(r["groups"])]
    runs.append(
        {
            "datetime": extra.get("datetime"),
            "machine_info": extra.get("machine_info"),
            "commit_info": extra.get("commit_info"),
            "groups": sorted(replaced),
        }
    )
    base["merged_runs"] = runs
    pathlib.Path(base_path).write_text(json.dumps(base, indent=4))


def main(argv=None):
    """``report.py [bench.json]``; ``report.py --merge other.json [bench.json]`` first merges."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = None
    if argv[:1] == ["--merge"]:
        extra, argv = argv[1], argv[2:]
    source = pathlib.Path(argv[0]) if argv else RESULTS / "bench.json"
    if extra:
        merge(source, extra)
    data, groups = load(source)
    RESULTS.mkdir(parents=True, exist_ok=True)
    text = render(data, groups)
    (RESULTS / "bench.md").write_text(text)
    plot(groups, RESULTS / "bench.png")
    print(text)
    print(f"wrote {RESULTS / 'bench.md'} and {RESULTS / 'bench.png'}", file=sys.stderr)
    from benchmarks.zoo import report as zoo_report

    if zoo_report.zoo_benches(groups):
        zoo_md = zoo_report.render_zoo(data, groups, zoo_report.zoo_summaries())
        ZOO_RESULTS.mkdir(parents=True, exist_ok=True)
        (ZOO_RESULTS / "zoo_cpu.md").write_text(zoo_md)
        print(f"wrote {ZOO_RESULTS / 'zoo_cpu.md'}", file=sys.stderr)


if __name__ == "__main__":
    main()
