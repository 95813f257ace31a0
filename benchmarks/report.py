"""Render pytest-benchmark JSON as markdown tables and a PNG plot in benchmarks/results/.

    pytest benchmarks --benchmark-only --benchmark-json benchmarks/results/bench.json
    python benchmarks/report.py [benchmarks/results/bench.json]
    python benchmarks/report.py --merge other.json   # first merge another run's groups in

bench.json becomes bench.md and bench.png; its critic-zoo groups (``zoo:*``,
``test_bench_zoo.py``) become zoo_cpu.md: step times, ratios, the fastest path, the compiled
programs' figures and why the fastest wins. ``--merge`` puts a run of some suites only (the zoo,
say) into bench.json in place of the groups it re-ran, recording its date under ``merged_runs``.

Per group: median and interquartile range of one call, and the ratio of medians to the group's
baseline (the benchmark whose ``extra_info["baseline"]`` is true: the naive path, or the plain
critic step where the floor is the reference). ``lazy:*`` rows are 16 critic steps (dispatched
from Python) per call and also show the per-step time. Paired groups time their paths
interleaved; their tables give per-path medians and the median of per-round ratios.
"""

import json
import pathlib
import sys

HERE = pathlib.Path(__file__).parent
RESULTS = HERE / "results"
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


def load(path):
    data = json.loads(pathlib.Path(path).read_text())
    groups = {}
    for b in data["benchmarks"]:
        groups.setdefault(b["group"], []).append(b)
    return data, groups


def kind_of(group):
    return group.split(":", 1)[0]


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


def render_group(group, benches):
    lines = [f"**{group}**", ""]
    if benches[0]["extra_info"].get("path") == "paired":
        bench = benches[0]
        info = bench["extra_info"]
        base, also = info["baseline_path"], info.get("also_vs")
        per_step = bool(info.get("steps_per_call"))
        header = "| path | median | IQR | rounds |"
        header += (" per step |" if kind_of(group) == "lazy" else " per call |") if per_step else ""
        header += f" ratio to {base} (medians) | median per-round ratio |"
        header += f" ratio to {also} |" if also else ""
        lines += [header, "|" + "---|" * (header.count("|") - 1)]
        for r in paired_rows(bench):
            line = (
                f"| {r['path']}{' (baseline)' if r['baseline'] else ''} "
                f"| {fmt_time(r['median'])} | {fmt_time(r['q1'])} - {fmt_time(r['q3'])} "
                f"| {r['rounds']} |"
            )
            if per_step:
                line += f" {fmt_time(r['per_step'])} |"
            line += f" {r['ratio']:.3f}x | {r['paired']:.3f}x |"
            if also:
                line += f" {r['also']:.3f}x |"
            lines.append(line)
        load = info.get("loadavg_1m")
        if load:
            lines += ["", f"1-minute load average at start / end: {load[0]:.1f} / {load[1]:.1f}"]
        return lines + [""]
    header = "| path | median | IQR | rounds x iters | ratio | load |"
    lines += [header, "|" + "---|" * (header.count("|") - 1)]
    for r in group_rows(benches):
        ratio = f"{r['ratio']:.3f}x" if r["ratio"] is not None else "-"
        load = f"{r['load']:.1f}" if r["load"] is not None else "-"
        lines.append(
            f"| {r['path']}{' (baseline)' if r['baseline'] else ''} "
            f"| {fmt_time(r['median'])} | {fmt_time(r['q1'])} - {fmt_time(r['q3'])} "
            f"| {r['rounds']} x {r['iterations']} | {ratio} | {load} |"
        )
    return lines + [""]


def render_penalty_summary(groups):
    """One compact table: fastgp XLA / naive median ratio per shape and dtype."""
    lines = [
        (
            "| B x D | dtype | naive median | fastgp xla median | xla / naive (medians) "
            "| median per-round ratio |"
        ),
        "|---|---|---|---|---|---|",
    ]
    for group in sorted(
        (g for g in groups if kind_of(g) == "penalty"),
        key=lambda g: (g.split(":")[1], [int(v) for v in g.split(":")[2].split("x")]),
    ):
        rows = {r["path"]: r for r in paired_rows(groups[group][0])}
        if {"naive", "xla"} <= rows.keys():
            _, dtype, shape = group.split(":")
            lines.append(
                f"| {shape} | {dtype} | {fmt_time(rows['naive']['per_step'])} "
                f"| {fmt_time(rows['xla']['per_step'])} | {rows['xla']['ratio']:.3f}x "
                f"| {rows['xla']['paired']:.3f}x |"
            )
    return lines + [""]


def render_step_summary(groups):
    """One row per critic: medians of each path and fastgp's ratios to naive and to plain."""
    lines = [
        (
            "| critic (batch) | plain | naive | fastgp | fastgp reverse | fastgp / naive "
            "| fastgp / plain | fastgp reverse / naive | naive / plain |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for group in sorted(g for g in groups if kind_of(g) == "step"):
        info = groups[group][0]["extra_info"]
        m = info["median_s"]
        if not {"plain", "naive", "fastgp", "fastgp reverse"} <= m.keys():
            continue
        lines.append(
            f"| {group.split(':', 1)[1]} ({info.get('batch', '?')}) | {fmt_time(m['plain'])} "
            f"| {fmt_time(m['naive'])} | {fmt_time(m['fastgp'])} "
            f"| {fmt_time(m['fastgp reverse'])} | {m['fastgp'] / m['naive']:.3f}x "
            f"| {m['fastgp'] / m['plain']:.3f}x | {m['fastgp reverse'] / m['naive']:.3f}x "
            f"| {m['naive'] / m['plain']:.3f}x |"
        )
    return lines + [""]


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
                "The critic zoo (`benchmarks/zoo.py`): [zoo_cpu.md](zoo_cpu.md).",
                "",
            ]
            if zoo_benches(groups)
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


# --- The critic zoo (zoo:* groups) ---------------------------------------------------------------

ZOO_PENALISED = ("naive", "fastgp", "fastgp-reverse", "fastgp-remat", "fastgp-dots")
ZOO_PATHS = ("plain", *ZOO_PENALISED)
# Why the fastest path wins, per critic: the mechanism read off the compiled programs (the figures
# beside each note are recomputed from the programs on every run; "clear of" in the step table
# says which paths the fastest beat by more than the round-to-round spread).
ZOO_NOTES = {
    "resnet32": (
        "Stride-1 3x3 convolutions only, all run by Eigen on every path, the same ones and the "
        "same flops for naive and fastgp. fastgp's program differs in transposes: nested "
        "reverse (naive, fastgp-reverse) transposes 3x3x128x128 kernels again for the "
        "input-gradients of its input-gradients, reverse-over-forward's tangents reuse the "
        "forward's kernels. That is little data at batch 2: set fastgp / naive against the "
        "spread between equal programs (fastgp-reverse / naive) before reading a winner into it."
    ),
    "dcgan32": (
        "Nested reverse (naive, fastgp-reverse) differentiates its transposed (lhs-dilated) "
        "input-gradient convolutions with respect to their kernels: window-reversed, "
        "stride-dilated convolutions, one per layer, that XLA:CPU cannot give to Eigen and runs "
        "as scalar loops; a few percent of the flops, most of the step's time. "
        "Reverse-over-forward's backward is the VJP of a JVP: its tangents are forward "
        "convolutions, whose kernel gradients are ordinary Eigen ones. Flops and bytes are "
        "otherwise the same; the three fastgp paths compile to nearly one program."
    ),
    "lnconv32": (
        "The same kind of Eigen convolutions on every path; the difference is work. fastgp's "
        "program has one more 3x3 convolution in each of the first two blocks and more of the "
        "bilinear resize's dots (two per resize) than nested reverse's (naive and "
        "fastgp-reverse compile to the same program), about 9% more flops; remat='dots' adds "
        "more convolutions still. Nested reverse does the least work here."
    ),
    "stylegan2-64": (
        "R1 at the reals, stride-1 convolutions, blur as strided slices: the same Eigen "
        "convolutions and flops on every path; fastgp's program has fewer transposes and about "
        "12% fewer bytes, but at batch 2 the convolutions dominate and every path is within the "
        "spread."
    ),
    "vit32": (
        "Dots, not convolutions (the patch embedding is the only conv). fastgp's program has 32 "
        "more dots than nested reverse's (per block 4 attention-sized, 4 dense-layer-sized) "
        "and about 9% more flops: the VJP of the critic's JVP costs more than the VJP of its "
        "VJP through attention, where q.k^T and softmax.v multiply two input-dependent factors "
        "(the JVP carries both product-rule terms). remat='dots' keeps only dots without batch "
        "dimensions, so it also recomputes the batched attention dots. Nested reverse (naive "
        "and fastgp-reverse: one program) does the least work."
    ),
    "mlp": (
        "Dense layers only: every penalised path compiles to the same dots and flops; which one "
        "is fastest is the spread."
    ),
}


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
    lines = [
        "| critic | input (per sample) | batch | parameters | penalty | design |",
        "|---|---|---|---|---|---|",
    ]
    for critic, bench in benches.items():
        info = bench["extra_info"]
        shape = "x".join(str(d) for d in info.get("shape", []))
        lines.append(
            f"| {critic} | {shape} | {info.get('batch', '?')} | {info.get('params', 0):,} "
            f"| {info.get('kind', '?')} | {summaries.get(critic, '')} |"
        )
    return lines + [""]


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
    head = "| critic (batch) | " + " | ".join(ZOO_PATHS) + " |"
    rule = "|---|" + "---|" * len(ZOO_PATHS)
    times, vs_naive, vs_plain = [head, rule], [head, rule], [head, rule]
    fastest = [
        (
            "| critic | fastest | runner-up (its median / fastest's) | rounds the fastest won "
            "(vs runner-up, vs naive) | clear of (interquartile ranges apart) | fastest / naive "
            "| fastest / plain | fastgp-reverse / naive (the spread: the same work) "
            "| load at start / end |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for critic, bench in benches.items():
        info = bench["extra_info"]
        m = info["median_s"]
        label = f"| {critic} ({info.get('batch', '?')}) |"
        times.append(label + "".join(f" {m[p] * 1e3:.1f} |" for p in ZOO_PATHS))
        vs_naive.append(label + "".join(f" {m[p] / m['naive']:.3f}x |" for p in ZOO_PATHS))
        vs_plain.append(label + "".join(f" {m[p] / m['plain']:.3f}x |" for p in ZOO_PATHS))
        first, second = zoo_ranking(info)[:2]
        load = info.get("loadavg_1m") or [float("nan")] * 2
        won = [_rounds_won(info["samples_s"], first, other) for other in (second, "naive")]
        fastest.append(
            f"| {critic} | {first} | {second} ({m[second] / m[first]:.3f}x) "
            f"| {won[0]}, {won[1]} | {', '.join(_clear_of(info, first)) or 'none'} "
            f"| {m[first] / m['naive']:.3f}x | {m[first] / m['plain']:.3f}x | {_spread(info)} "
            f"| {load[0]:.1f} / {load[1]:.1f} |"
        )
    return [
        "Median milliseconds per critic step:",
        "",
        *times,
        "",
        "Each path's median / naive's:",
        "",
        *vs_naive,
        "",
        "Each path's median / plain's (the step without a penalty):",
        "",
        *vs_plain,
        "",
        "Fastest penalised path:",
        "",
        *fastest,
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
    for critic, programs in programs_by_critic.items():
        head = "| path | " + " | ".join(name for name, _ in PROGRAM_COLUMNS) + " |"
        lines += [f"**{critic}**", "", head, "|---|" + "---|" * len(PROGRAM_COLUMNS)]
        for path, fig in programs.items():
            lines.append(
                f"| {path} | " + " | ".join(cell(fig) for _, cell in PROGRAM_COLUMNS) + " |"
            )
        lines.append("")
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
    lines = [
        "| critic | fastest | fastgp / naive | fastgp's program vs naive's | why |",
        "|---|---|---|---|---|",
    ]
    for critic, bench in benches.items():
        info = bench["extra_info"]
        m, programs = info["median_s"], info.get("programs", {})
        diff = program_difference(programs["fastgp"], programs["naive"]) if programs else "-"
        lines.append(
            f"| {critic} | {zoo_ranking(info)[0]} | {m['fastgp'] / m['naive']:.3f}x | {diff} "
            f"| {ZOO_NOTES.get(critic, '')} |"
        )
    return lines + [""]


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
            "critic in `benchmarks/zoo.py` (`ZOO_CPU`, float32), every path compiled once and "
            "timed interleaved round by round (`benchmarks/test_bench_zoo.py`); medians of warm "
            "calls; ratios are ratios of medians within this run. Paths: `plain` (no penalty), "
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
            "Counted in each path's optimised HLO (`benchmarks/zoo_programs.py`: convolutions "
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
    """zoo.SUMMARY (one line per critic), or {} where the zoo cannot be imported."""
    sys.path.insert(0, str(HERE))
    try:
        import zoo
    except ImportError:
        return {}
    return zoo.SUMMARY


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
    if zoo_benches(groups):
        (RESULTS / "zoo_cpu.md").write_text(render_zoo(data, groups, zoo_summaries()))
        print(f"wrote {RESULTS / 'zoo_cpu.md'}", file=sys.stderr)


if __name__ == "__main__":
    main()
