"""The tables docs/performance.md quotes about approximate_r1, rendered from
benchmarks/results/approximate_r1/.

Each function takes ``benchmarks.published.Results`` and returns the table's lines:

    ratios(results)     approximate_r1.json: ratio to sigma^2 R1 per critic, training and sigma
    cost(results)       approximate_r1.json (CPU times), approximate_r1_tpu.json (v5e compiles)
    gradients(results)  approximate_r1_gradients.json: the mean gradient against exact R1's
    training(results)   approximate_r1_training.json: quality and time per penalty and seed
    long_tpu(results)   ../attention/attention_tpu.json: the long ViT's R1 steps for one v5e chip
    long_cpu(results)   long_sequences.json: the long ViT's R1 steps timed on CPU
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


# Long ViT critic steps: the rows of the cost table, as (label, attention/variant record name).
LONG_TPU_ROWS = (
    ("no penalty (fastgp flash)", "flash/plain"),
    ("no penalty (JAX flash*)", "jax-flash/plain"),
    ("exact R1 (fastgp flash)", "flash/exact-r1"),
    ("approximate_r1 (fastgp flash)", "flash/approximate-r1"),
    ("approximate_r1 (JAX flash*)", "jax-flash/approximate-r1"),
    ("WGAN-GP (fastgp flash)", "flash/fastgp"),
)
LAZY_EVERY = (4, 16)


def _largest_batch(records, tokens, variant):
    """The largest batch on record that compiled within HBM, and whether twice it did not."""
    mine = [r for r in records if (r["tokens"], r["variant"]) == (tokens, variant)]
    fits = [r["batch"] for r in mine if r["fits"]]
    if not fits:
        return "-"
    best = max(fits)
    exhausted = any(
        r["batch"] == 2 * best and "RESOURCE_EXHAUSTED" in r.get("error", "") for r in mine
    )
    return str(best) if exhausted else f">= {best}"


def _lazy(exact, plain, every, keys=("flops", "bytes")):
    """Lazy R1 every ``every`` steps: one exact step and every - 1 plain ones, per step (each of
    ``keys`` amortised; the rest, such as the peak and batch, the exact step's)."""
    amortised = {k: (exact[k] + (every - 1) * plain[k]) / every for k in keys}
    return {**exact, **amortised}


def long_tpu(results, generation="v5e"):
    """Per token count and step: per-sample TFLOP and GB, peak GiB at the probe batch, each over
    exact R1's, and the largest batch that compiles, for one ``generation`` chip."""
    from benchmarks.attention.tpu import probe_batch  # the compiles' own (it imports JAX)

    compiled = pathlib.Path(results.dir) / "attention" / "attention_tpu.json"
    records = [r for r in json.loads(compiled.read_text()) if r["generation"] == generation]
    rows = []
    for tokens in sorted({r["tokens"] for r in records}):
        batch = probe_batch(tokens)
        at = {
            r["variant"]: r
            for r in records
            if (r["tokens"], r["batch"]) == (tokens, batch) and r["fits"]
        }
        if "flash/exact-r1" not in at or "flash/plain" not in at:
            continue
        exact = at["flash/exact-r1"]
        steps = [
            (label, at[name], _largest_batch(records, tokens, name))
            for label, name in LONG_TPU_ROWS
            if name in at
        ]
        steps += [
            (f"lazy exact R1 every {k} (amortised)", _lazy(exact, at["flash/plain"], k), "-")
            for k in LAZY_EVERY
        ]
        for label, r, largest in steps:
            rows.append(
                [
                    f"{tokens:,}",
                    label,
                    f"{r['flops'] / batch / 1e12:.3f}",
                    f"{r['bytes'] / batch / 1e9:.2f}",
                    f"{r['peak'] / 2**30:.2f}",
                    ", ".join(f"{r[k] / exact[k]:.2f}x" for k in ("flops", "bytes", "peak")),
                    largest,
                ]
            )
    head = [
        *("tokens", "critic step", "TFLOP / sample", "GB moved / sample"),
        *("peak GiB", "over exact R1 (flops, bytes, peak)", "largest batch"),
    ]
    return markdown_table(head, rows)


def long_cpu(results):
    """Per token count and step: the median CPU step time, its ratio to exact R1 through
    fastgp.attention, and the compiled temporaries."""
    found = _load(results, "long_sequences.json")
    labels = {
        "fastgp/plain": "no penalty (fastgp.attention)",
        "dpa/plain": "no penalty (dot_product_attention)",
        "fastgp/exact-r1": "exact R1 (fastgp.attention)",
        "dpa/exact-r1": "exact R1 (dot_product_attention)",
        "fastgp/approximate-r1": "approximate_r1 (fastgp.attention)",
        "dpa/approximate-r1": "approximate_r1 (dot_product_attention)",
        "fastgp/wgan-gp": "WGAN-GP (fastgp.attention)",
    }
    rows = []
    for tokens in sorted({r["tokens"] for r in found["rows"]}):
        at = {r["variant"]: r for r in found["rows"] if r["tokens"] == tokens}
        exact, plain = at["fastgp/exact-r1"], at["fastgp/plain"]
        steps = [(labels[v], r, f"{r['temp'] / 2**20:,.0f}") for v, r in at.items()]
        steps += [
            (f"lazy exact R1 every {k} (amortised)", _lazy(exact, plain, k, ("seconds",)), "-")
            for k in LAZY_EVERY
        ]
        for label, r, temp in steps:
            rows.append(
                [
                    f"{tokens:,} ({exact['batch']})",
                    label,
                    f"{r['seconds'] * 1e3:,.0f}",
                    f"{r['seconds'] / exact['seconds']:.2f}x",
                    temp,
                ]
            )
    head = ["tokens (batch)", "critic step", "ms", "over exact R1", "temporaries MiB"]
    return markdown_table(head, rows)


def transformer_training(results):
    """Per penalty of the ViT digits runs: each seed's C2ST and Frechet distance, the classes
    covered, how many runs collapsed and the median train_s."""
    from benchmarks.approximate_r1.transformer_training import collapsed

    groups: dict[str, list[dict]] = {}
    for run in _load(results, "transformer_training.json")["runs"]:
        groups.setdefault(run["penalty"], []).append(run)
    rows = []
    for penalty, runs in groups.items():
        runs = sorted(runs, key=lambda r: r["seed"])
        finished = [r for r in runs if not r.get("failed")]
        rows.append(
            [
                penalty,
                ", ".join(str(r["seed"]) for r in runs),
                "; ".join(
                    "failed" if r.get("failed") else f"{r['c2st_accuracy']:.3f}" for r in runs
                ),
                "; ".join("-" if r.get("failed") else f"{r['frechet_distance']:.2f}" for r in runs),
                "; ".join("-" if r.get("failed") else str(r["classes_covered"]) for r in runs),
                f"{sum(collapsed(r) for r in runs)} / {len(runs)}",
                f"{statistics.median(r['train_s'] for r in finished):.0f}" if finished else "-",
            ]
        )
    head = [
        *("penalty", "seeds", "C2ST per seed", "Frechet per seed", "classes per seed"),
        *("collapsed", "median train_s"),
    ]
    return markdown_table(head, rows)


def _span(values, fmt="{:.2f}"):
    low, high = fmt.format(min(values)), fmt.format(max(values))
    return low if low == high else f"{low}\N{EN DASH}{high}"


def exact_over_approximate(results):
    """The practitioner's answer in one sentence, from the three results files: exact R1's cost
    over approximate_r1's on the long ViT (v5e compiles, CPU times), and how often each penalty's
    ViT training runs collapsed."""
    from benchmarks.approximate_r1.transformer_training import collapsed
    from benchmarks.attention.tpu import probe_batch

    compiled = pathlib.Path(results.dir) / "attention" / "attention_tpu.json"
    records = json.loads(compiled.read_text())
    at = {
        (r["tokens"], r["variant"]): r
        for r in records
        if r["generation"] == "v5e" and r["fits"] and r["batch"] == probe_batch(r["tokens"])
    }
    tokens = sorted(t for t, v in at if v == "flash/exact-r1" and (t, "flash/approximate-r1") in at)
    exact = [at[t, "flash/exact-r1"] for t in tokens]
    ours = [at[t, "flash/approximate-r1"] for t in tokens]
    jax_flash = [at[t, "jax-flash/approximate-r1"] for t in tokens]
    times = _load(results, "long_sequences.json")["rows"]
    cpu_tokens = sorted({r["tokens"] for r in times})
    seconds = {(r["tokens"], r["variant"]): r["seconds"] for r in times}
    cpu = [
        seconds[t, "fastgp/exact-r1"]
        / min(seconds[t, "fastgp/approximate-r1"], seconds[t, "dpa/approximate-r1"])
        for t in cpu_tokens
    ]
    runs: dict[str, list[dict]] = {}
    for run in _load(results, "transformer_training.json")["runs"]:
        runs.setdefault(run["penalty"], []).append(run)
    names = {
        "exact-r1": "exact R1",
        "apt": "approximate_r1 at APT's λ = 100",
        "apt-rule": "approximate_r1 at the λσ² weight",
        "exact-r1-apt": "exact R1 at APT's effective weight λσ²",
        "exact-r1-100": "exact R1 at weight 100",
        "apt-rule-100": "approximate_r1 at the λσ² weight for 100",
        "lazy-r1-16": "lazy exact R1 every 16 steps",
        "wgan-gp": "WGAN-GP",
    }
    outcomes = ", ".join(
        f"{names[p]} {sum(collapsed(r) for r in rs)} of {len(rs)}" for p, rs in runs.items()
    )

    def ratios(key, over):
        return _span([e[key] / o[key] for e, o in zip(exact, over, strict=True)])

    return (
        f"on one v5e chip at {_span(tokens, '{:,}')} tokens, exact R1's critic step costs "
        f"{ratios('flops', ours)}x approximate_r1's flops and {ratios('bytes', ours)}x its bytes "
        f"(both through fastgp's kernels, counted alike), and {ratios('peak', ours)}x its peak "
        f"memory there but {ratios('peak', jax_flash)}x the peak of approximate_r1 through JAX's "
        f"flash attention; on CPU at "
        f"{_span(cpu_tokens, '{:,}')} tokens it takes {_span(cpu)}x the faster approximate "
        f"step's time. Training the digits ViT, the runs that collapsed: {outcomes}"
    )
