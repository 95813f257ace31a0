"""The critic zoo's CPU report: benchmarks/results/zoo/zoo_cpu.md from bench.json's ``zoo:*``
groups.

    python -m benchmarks.suites.report   (writes zoo_cpu.md when bench.json has the zoo)

Step times of every path (``suites/test_bench_zoo.py`` times them interleaved), their ratios to
naive's and plain's, the fastest penalised path and how clearly it won, and the compiled programs'
figures (``zoo.programs.figures``) with what differs between fastgp's program and naive's.
"""

from benchmarks.suites.bench_json import kind_of, load
from benchmarks.tables import markdown_table

__all__ = ["load", "render_zoo", "render_zoo_programs", "same_work", "zoo_benches", "zoo_run"]

ZOO_PENALISED = ("naive", "fastgp", "fastgp-reverse", "fastgp-remat", "fastgp-dots")
ZOO_PATHS = ("plain", *ZOO_PENALISED)
# Why the fastest path wins is read off the compiled programs' figures below (recomputed on every
# run); the mechanism per critic is docs/performance.md's prose, not this report's.
ZOO_WHY = "docs/performance.md#why-the-fastest-path-wins-on-cpu"


def zoo_benches(groups):
    """{critic: the paired benchmark of group zoo:<critic>}, in run order."""
    return {g.split(":", 1)[1]: groups[g][0] for g in groups if kind_of(g) == "zoo"}


def zoo_ranking(info):
    """The penalised paths, fastest first (by median)."""
    m = info["median_s"]
    return sorted((p for p in ZOO_PENALISED if p in m), key=m.get)


def _mb(n):
    return f"{n / 2**20:.1f}"


def render_zoo_specs(benches, summaries):
    rows = []
    for critic, bench in benches.items():
        info = bench["extra_info"]
        shape = "x".join(str(d) for d in info.get("shape", []))
        rows.append(
            [
                critic,
                shape,
                info.get("batch", "?"),
                f"{info.get('params', 0):,}",
                info.get("kind", "?"),
                summaries.get(critic, ""),
            ]
        )
    head = ["critic", "input (per sample)", "batch", "parameters", "penalty", "design"]
    return [*markdown_table(head, rows), ""]


def _rounds_won(samples, path, other):
    """'k/n': the rounds in which ``path`` took less time than ``other``."""
    pairs = list(zip(samples[path], samples[other], strict=True))
    return f"{sum(a < b for a, b in pairs)}/{len(pairs)}"


def _clear_of(info, path):
    """The penalised paths whose interquartile range lies wholly above ``path``'s."""
    q3 = info["iqr_s"][path][1]
    return [p for p in zoo_ranking(info) if p != path and info["iqr_s"][p][0] > q3]


def _spread(info):
    """fastgp-reverse / naive where the two compile to the same work (nested reverse both): the
    difference that this run's timing shows between equal programs."""
    programs, m = info.get("programs", {}), info["median_s"]
    if {"naive", "fastgp-reverse"} <= programs.keys() and same_work(
        programs["fastgp-reverse"], programs["naive"]
    ):
        return f"{m['fastgp-reverse'] / m['naive']:.3f}x"
    return "-"


def render_zoo_steps(benches):
    """Three tables: medians, each / naive, each / plain; then the fastest path per critic."""
    times, vs_naive, vs_plain, fastest = [], [], [], []
    for critic, bench in benches.items():
        info = bench["extra_info"]
        m = info["median_s"]
        label = f"{critic} ({info.get('batch', '?')})"
        times.append([label, *(f"{m[p] * 1e3:.1f}" for p in ZOO_PATHS)])
        vs_naive.append([label, *(f"{m[p] / m['naive']:.3f}x" for p in ZOO_PATHS)])
        vs_plain.append([label, *(f"{m[p] / m['plain']:.3f}x" for p in ZOO_PATHS)])
        first, second = zoo_ranking(info)[:2]
        load = info.get("loadavg_1m") or [float("nan")] * 2
        won = [_rounds_won(info["samples_s"], first, other) for other in (second, "naive")]
        fastest.append(
            [
                critic,
                first,
                f"{second} ({m[second] / m[first]:.3f}x)",
                f"{won[0]}, {won[1]}",
                ", ".join(_clear_of(info, first)) or "none",
                f"{m[first] / m['naive']:.3f}x",
                f"{m[first] / m['plain']:.3f}x",
                _spread(info),
                f"{load[0]:.1f} / {load[1]:.1f}",
            ]
        )
    head = ["critic (batch)", *ZOO_PATHS]
    fastest_head = [
        "critic",
        "fastest",
        "runner-up (its median / fastest's)",
        "rounds the fastest won (vs runner-up, vs naive)",
        "clear of (interquartile ranges apart)",
        "fastest / naive",
        "fastest / plain",
        "fastgp-reverse / naive (the spread: the same work)",
        "load at start / end",
    ]
    return [
        "Median milliseconds per critic step:",
        "",
        *markdown_table(head, times),
        "",
        "Each path's median / naive's:",
        "",
        *markdown_table(head, vs_naive),
        "",
        "Each path's median / plain's (the step without a penalty):",
        "",
        *markdown_table(head, vs_plain),
        "",
        "Fastest penalised path:",
        "",
        *markdown_table(fastest_head, fastest),
        "",
    ]


PROGRAM_COLUMNS = (
    ("convs (act + wgrad)", lambda f: f"{f['conv']} ({f['conv_act']} + {f['conv_wgrad']})"),
    ("loop-emitted convs (GFLOP)", lambda f: f"{f['conv_loop']} ({f['loop_gflop']:.2f})"),
    ("lhs-dilated", lambda f: f"{f['lhs_dilate']}"),
    ("window-reversed", lambda f: f"{f['rhs_reversal']}"),
    ("grouped (feature / batch)", lambda f: f"{f['feature_groups']} / {f['batch_groups']}"),
    ("conv GFLOP", lambda f: f"{f['conv_gflop']:.2f}"),
    ("dots (GFLOP)", lambda f: f"{f['dot']} ({f['dot_gflop']:.2f})"),
    ("transposes (MiB)", lambda f: f"{f['transpose']} ({f.get('transpose_mib', 0.0):.1f})"),
    ("copies", lambda f: f"{f['copy']}"),
    ("fusions", lambda f: f"{f['fusions']}"),
    ("XLA GFLOP", lambda f: f"{f['flops'] / 1e9:.2f}"),
    ("XLA MiB accessed", lambda f: _mb(f["bytes"])),
    ("temp MiB", lambda f: _mb(f["temp_bytes"])),
)


def render_zoo_programs(programs_by_critic):
    """One table per critic: the figures of each path's compiled step (zoo_programs.figures)."""
    lines = []
    head = ["path", *(name for name, _ in PROGRAM_COLUMNS)]
    for critic, programs in programs_by_critic.items():
        rows = [
            [path, *(cell(fig) for _, cell in PROGRAM_COLUMNS)] for path, fig in programs.items()
        ]
        lines += [f"**{critic}**", "", *markdown_table(head, rows), ""]
    return lines


_COMPARED = (
    ("convs", "conv", "{}"),
    ("loop-emitted convs", "conv_loop", "{}"),
    ("loop-emitted GFLOP", "loop_gflop", "{:.2f}"),
    ("conv GFLOP", "conv_gflop", "{:.2f}"),
    ("dots", "dot", "{}"),
    ("transposes", "transpose", "{}"),
    ("MiB transposed", "transpose_mib", "{:.1f}"),
)


def same_work(ours, ref):
    """Whether two programs have the same convolutions, dots and transposes, flops within 1%."""
    counts = ("conv", "conv_loop", "dot", "transpose")
    return all(ours[k] == ref[k] for k in counts) and abs(ours["flops"] / ref["flops"] - 1) < 0.01


def program_difference(ours, ref):
    """What differs between two programs' figures (ours against ref), then XLA's ratios."""
    if same_work(ours, ref):
        parts = ["the same convolutions, dots and transposes"]
    else:
        parts = [
            f"{label} {fmt.format(ref[key])} -> {fmt.format(ours[key])}"
            for label, key, fmt in _COMPARED
            if key in ours and fmt.format(ours[key]) != fmt.format(ref[key])
        ]
    flops, moved = ours["flops"] / ref["flops"], ours["bytes"] / ref["bytes"]
    return "; ".join([*parts, f"XLA flops {flops:.2f}x, bytes {moved:.2f}x"])


def render_zoo_reasons(benches):
    rows = []
    for critic, bench in benches.items():
        info = bench["extra_info"]
        m, programs = info["median_s"], info.get("programs", {})
        diff = program_difference(programs["fastgp"], programs["naive"]) if programs else "-"
        rows.append([critic, zoo_ranking(info)[0], f"{m['fastgp'] / m['naive']:.3f}x", diff])
    head = ["critic", "fastest", "fastgp / naive", "fastgp's program vs naive's"]
    return [
        *markdown_table(head, rows),
        "",
        f"The mechanism behind each difference: [performance.md](../../../{ZOO_WHY}).",
        "",
    ]


def zoo_run(data, groups):
    """The run the zoo groups came from: a merged run's record, or the file's own."""
    zoo = {g for g in groups if kind_of(g) == "zoo"}
    for run in data.get("merged_runs", []):
        if zoo <= set(run["groups"]):
            return run
    return data


def render_zoo(data, groups, summaries=None):
    benches = zoo_benches(groups)
    run = zoo_run(data, groups)
    m = run.get("machine_info") or {}
    cpu = m.get("cpu", {})
    lines = [
        "# Critic zoo: whole critic steps on CPU",
        "",
        (
            f"Run {run.get('datetime', '?')}; {cpu.get('brand_raw', '?')}, "
            f"{cpu.get('count', '?')} logical CPUs, Python {m.get('python_version', '?')}. "
            "One critic step (critic loss + penalty, value_and_grad wrt params, Adam) of each "
            "critic in `benchmarks/zoo/critics.py` (`ZOO_CPU`, float32), every path compiled once "
            "and timed interleaved round by round (`benchmarks/suites/test_bench_zoo.py`); "
            "medians of warm calls; ratios are ratios of medians within this run. Paths: "
            "`plain` (no penalty), "
            "`naive` (nested jax.grad), `fastgp` (default: reverse-over-forward), "
            '`fastgp-reverse` (second_order="reverse"), `fastgp-remat` (remat="nothing"), '
            '`fastgp-dots` (remat="dots"); before timing, each penalised path\'s loss and '
            "parameter gradient are checked against naive's. The load averages are those of the "
            "machine, shared with other processes: the `fastgp-reverse / naive` column (nested "
            "reverse both, the same work) shows how far equal programs' times differ here."
        ),
        "",
        "## The zoo",
        "",
        *render_zoo_specs(benches, summaries or {}),
        "## Step times",
        "",
        *render_zoo_steps(benches),
        "## Why the fastest path wins (or the paths tie)",
        "",
        *render_zoo_reasons(benches),
        "## The compiled programs",
        "",
        (
            "Counted in each path's optimised HLO (`benchmarks/zoo/programs.py`: convolutions "
            "producing activations / weight gradients; loop-emitted: convolutions XLA:CPU cannot "
            "give to Eigen, which it runs as scalar loops; conv GFLOP counts every window "
            "position, dilation holes included; XLA GFLOP and MiB from XLA's cost analysis)."
        ),
        "",
        *render_zoo_programs(
            {
                c: b["extra_info"]["programs"]
                for c, b in benches.items()
                if "programs" in b["extra_info"]
            }
        ),
    ]
    return "\n".join(lines)


def zoo_summaries():
    """critics.SUMMARY (one line per critic), or {} where the zoo cannot be imported."""
    try:
        from benchmarks.zoo import critics
    except ImportError:
        return {}
    return critics.SUMMARY
