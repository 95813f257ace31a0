"""The figures that README.md and docs/*.md quote from benchmarks/results/, rendered from there.

    python -m benchmarks.published            # print every block
    python -m benchmarks.published --write    # rewrite the marked blocks of README.md, docs/*.md

A page marks a quoted block as ``<!-- results:NAME -->`` ... ``<!-- /results:NAME -->`` (a table
on lines of its own, or a sentence inside a paragraph); ``tests/docs/test_figures.py`` checks that
the text between the marks is :func:`render` of ``NAME``, so a page whose figures the results files
no longer give fails the suite. Sources, per block (:data:`BLOCKS`, paths under results/):

    suites/bench.json                  the CPU zoo (suites/report.py renders zoo/zoo_cpu.md of it)
    zoo/zoo_tpu.json,                  the zoo compiled for v5e and v6e (zoo/zoo_tpu.md)
      zoo/zoo_capacity_compiles.json
    zoo/zoo_capacity.json              the largest batch per chip (zoo/zoo_capacity.md)
    training/train_time.json           the toy runs' times and quality (training/train_time.md)
    training/trainer_runs.json         the digits runs, and the published toy figures
    attention/attention_tpu.json       the long-sequence ViT critics (attention/attention_tpu.md)
    attention/sequence_tpu.json        the ViT critic's tokens over 4-16 v5e chips, every scheme
    approximate_r1/approximate_r1*     approximate_r1 against exact R1 (its own tables, .json)
    approximate_r1/long_sequences.json the long ViT's R1 steps on CPU (with attention_tpu.json's)
    approximate_r1/transformer_training.json  the ViT critic trained with each penalty
    attention/jvp_memory.json          a transformer block's JVP memory (recipes.md)
    attention/sequence_memory.json     split tokens' memory per CPU device, ring and gather
    attention/sequence_memory_h8.json  the same with 8 heads, beside the all-to-all
    attention/sequence_memory_memory_scheduler.json  the same under XLA:CPU's memory scheduler
    attention/sequence_time_h8.json    their times on CPU, 4,096 tokens, shard_map
    attention/sequence_axes.json       the tokens over two axes: all-to-all then ring, per device
    attention/sequence_axes_tpu.json   the same R1 program per v5e chip (compile-only)
    attention/sequence_axes_time.json  the split and the ring timed on CPU, 4,096 tokens
    attention/sequence_memory_tpu.json the same R1 program per v5e chip (compile-only)
    attention/ring_overlap.json        what runs beside the ring's transfers on v5e (compile-only)
    attention/auto_cpu.json            with attention_tpu.json, gpu/: what attention's "auto" runs
    attention/step_time_cpu.json       a ViT critic's step on CPU: fastgp's, JAX's, Flax's attention
    gpu/attention_gpu*.json            the long ViT's steps through each attention on an H200
    gpu/gpu_bandwidth.md               the penalty's Triton kernel against XLA on an H200
    tpu/tpu_compile.json               the toy critics compiled for v5e, v6e and TPU7x, per JAX
    tpu/tpu_sharded_compile.json       the conv critic's step sharded over TPU meshes, per JAX
    tpu/vmem_request_three_quarters.json  the penalty kernels' steps asking for 3/4 of VMEM
    exactness/study_*.json, sigma.json  exact against approximate R1 trained on MNIST
    exactness/declared_*.json          the declared study's runs so far (declared.md)
    training/check_isa.json            fastgp check under every CPU vector width
"""

import importlib
import json
import pathlib
import re
import sys
from collections.abc import Callable
from typing import Any, NamedTuple

import benchmarks
from benchmarks import harness
from benchmarks.approximate_r1 import tables as approximate_r1_tables
from benchmarks.exactness import tables as exactness_tables
from benchmarks.tables import markdown_table
from benchmarks.tpu import versions as tpu_versions
from benchmarks.zoo import report as zoo_report

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = benchmarks.RESULTS

PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
MARK = re.compile(r"<!-- results:([a-z0-9-]+) -->(.*?)<!-- /results:\1 -->", re.S)

CRITICS = ("dcgan32", "resnet32", "stylegan2-64", "mlp", "lnconv32", "vit32")
FASTGP_PATHS = ("fastgp", "fastgp-reverse", "fastgp-remat", "fastgp-dots")
# How the pages name the paths of the benchmarks.
LABELS = {
    "naive": "naive",
    "fastgp": "the default",
    "fastgp-reverse": "reverse",
    "fastgp-remat": 'remat="nothing"',
    "fastgp-dots": 'remat="dots"',
    "fastgp-pallas": 'backend="pallas"',
    "plain": "plain",
}
SAME = 5e-4  # byte ratios within this of 1 are "the same"
DASH, TIMES, PLUS_MINUS = "\N{EN DASH}", "\N{MULTIPLICATION SIGN}", "\N{PLUS-MINUS SIGN}"
LIKE = "\N{ALMOST EQUAL TO} \N{GREEK SMALL LETTER SIGMA}"
FRECHET = "Fr\N{LATIN SMALL LETTER E WITH ACUTE}chet"


def _json(name):
    return json.loads((RESULTS / name).read_text())


class Results:
    """The results files, each read when a block first needs it."""

    def __init__(self, results=RESULTS):
        self.dir = pathlib.Path(results)
        self._cache = {}

    def _get(self, key, load):
        if key not in self._cache:
            self._cache[key] = load()
        return self._cache[key]

    @property
    def cpu(self):
        """{critic: the paired benchmark's extra_info} of the CPU zoo in bench.json."""

        def load():
            _, groups = zoo_report.load(self.dir / "suites" / "bench.json")
            return {c: b["extra_info"] for c, b in zoo_report.zoo_benches(groups).items()}

        return self._get("cpu", load)

    def tpu(self, generation, critic, variant):
        """The compiled figures of one zoo step at the zoo batch, or None if not compiled."""

        def load():
            from benchmarks.zoo import tpu as zoo_tpu

            cache = zoo_tpu.Cache(
                self.dir / "zoo" / "zoo_tpu.json", self.dir / "zoo" / "zoo_capacity_compiles.json"
            )
            return {
                (r["generation"], r["critic"], r["variant"]): r
                for r in zoo_tpu.at_zoo_batch(cache.records)
            }

        return self._get("tpu", load).get((generation, critic, variant))

    def bytes_ratio(self, generation, critic, variant, over="naive"):
        ours, ref = self.tpu(generation, critic, variant), self.tpu(generation, critic, over)
        return None if ours is None or ref is None else ours["bytes"] / ref["bytes"]

    def capacity(self, critic, variant):
        """The largest batch that fitted one v5e chip (zoo/zoo_capacity.json), or None."""
        rows = self._get("capacity", lambda: _json_in(self.dir, "zoo/zoo_capacity.json"))
        found = [r["fits"] for r in rows if (r["critic"], r["variant"]) == (critic, variant)]
        return found[0] if found else None

    @property
    def train_time(self):
        return self._get("train_time", lambda: _json_in(self.dir, "training/train_time.json"))

    @property
    def trainer_runs(self):
        return self._get("trainer_runs", lambda: _json_in(self.dir, "training/trainer_runs.json"))


def _json_in(directory, name):
    return json.loads((pathlib.Path(directory) / name).read_text())


# --- the CPU zoo -------------------------------------------------------------------------------


def fastest_exact(info):
    """(path, its label with the ratio to naive) of the fastest fastgp path in a CPU zoo run."""
    m, programs = info["median_s"], info.get("programs", {})
    best = min((p for p in FASTGP_PATHS if p in m), key=m.get)
    if best == "fastgp":
        return best, "the default"
    label = f"{LABELS[best]} {m[best] / m['naive']:.3f}x"
    if set(programs) >= {"naive", *FASTGP_PATHS} and all(
        zoo_report.same_work(programs[p], programs["naive"]) for p in FASTGP_PATHS
    ):
        label += " (one program: noise)"
    elif best == "fastgp-reverse" and zoo_report.same_work(programs[best], programs["naive"]):
        label += " (naive's program)"
    return best, label


def _cpu_ratio(info, path="fastgp"):
    return info["median_s"][path] / info["median_s"]["naive"]


def _by_cpu_ratio(results):
    return sorted(results.cpu, key=lambda c: _cpu_ratio(results.cpu[c]))


def zoo_summary(results):
    """README's and performance.md's table: CPU times and v5e figures per critic."""
    rows = []
    for critic in _by_cpu_ratio(results):
        info = results.cpu[critic]
        naive, ours = (results.tpu("v5e", critic, v) for v in ("naive", "fastgp"))
        rows.append(
            [
                critic,
                f"{_cpu_ratio(info):.3f}x",
                fastest_exact(info)[1],
                f"{ours['bytes'] / naive['bytes']:.4f}x",
                f"{ours['flops'] / naive['flops']:.4f}x",
                f"{naive['copies']} / {ours['copies']}",
                " / ".join(
                    str(results.capacity(critic, v)) for v in ("naive", "fastgp", "fastgp-remat")
                ),
            ]
        )
    return markdown_table(
        [
            "critic",
            "CPU: fastgp / naive",
            "CPU: fastest exact (/ naive)",
            "v5e: fastgp bytes / naive",
            "v5e: flops",
            "v5e copies naive / fastgp",
            "v5e batch per chip: naive / fastgp / remat",
        ],
        rows,
    )


def zoo_cpu(results):
    """performance.md's CPU table: ratios and what XLA's cost analysis says of the programs."""
    rows = []
    for critic in _by_cpu_ratio(results):
        info = results.cpu[critic]
        ours, ref = info["programs"]["fastgp"], info["programs"]["naive"]
        rows.append(
            [
                f"{critic} ({info['batch']})",
                f"{_cpu_ratio(info):.3f}x",
                fastest_exact(info)[1],
                f"{_cpu_ratio(info, 'fastgp-reverse'):.3f}x",
                f"{ours['flops'] / ref['flops']:.2f}x",
                f"{ours['bytes'] / ref['bytes']:.2f}x",
                f"{ref['transpose']} / {ours['transpose']}",
            ]
        )
    return markdown_table(
        [
            "critic (CPU batch)",
            "fastgp / naive",
            "fastest exact path (/ naive)",
            "fastgp-reverse / naive (the spread)",
            "XLA flops fastgp / naive",
            "bytes",
            "transposes naive / fastgp",
        ],
        rows,
    )


def _range(values, fmt="{:.3f}"):
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return lo if lo == hi else f"{lo}{DASH}{hi}"


def zoo_headline(results):
    """The README's sentence: the CPU step ratios and the TPU bytes over the whole zoo."""
    cpu = {c: _cpu_ratio(i) for c, i in results.cpu.items()}
    low, high = min(cpu, key=lambda c: cpu[c]), max(cpu, key=lambda c: cpu[c])
    moved = {
        g: [results.bytes_ratio(g, c, "fastgp") for c in CRITICS if results.tpu(g, c, "fastgp")]
        for g in ("v5e", "v6e")
    }
    return (
        f"over the zoo's {len(cpu)} critics the whole critic step costs {cpu[low]:.3f}x "
        f"({low}) to {cpu[high]:.3f}x ({high}) the nested-`jax.grad` step on XLA:CPU, and moves "
        f"{_range(moved['v5e'])}x its bytes in the TPU v5e compiler, "
        f"{_range(moved['v6e'])}x in v6e's"
    )


def _percent_groups(results, generation):
    """{'fewer' / 'the same' / 'more': [(critic, |ratio - 1|)]} of the Pallas step's bytes
    against the default's, and the critics not compiled."""
    groups: dict[str, list[tuple[str, float]]] = {"fewer": [], "the same": [], "more": []}
    missing = []
    for critic in CRITICS:
        ratio = results.bytes_ratio(generation, critic, "fastgp-pallas", over="fastgp")
        if ratio is None:
            missing.append(critic)
        elif abs(ratio - 1) < SAME:
            groups["the same"].append((critic, 0.0))
        else:
            groups["fewer" if ratio < 1 else "more"].append((critic, abs(ratio - 1)))
    return groups, missing


def _names(items):
    names = [c for c, _ in items]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def zoo_pallas(results):
    """The clause on backend="pallas" against the default's step, per generation, over the zoo:
    'on v5e fewer bytes on a and b (x-y %), as many on c and more on d (x %); on v6e ...'."""
    parts: list[str] = []
    for generation in ("v5e", "v6e"):
        groups, missing = _percent_groups(results, generation)
        said = []
        for word in ("fewer", "the same", "more"):
            items = groups[word]
            if word == "the same" and items:
                said.append(f"as many on {_names(items)}")
            elif items:
                share = _range([100 * d for _, d in items], "{:.1f}")
                said.append(f"{word} on {_names(items)} ({share} %)")
        said[0] = said[0].replace(" on ", " bytes on ", 1) if not parts else said[0]
        text = f"on {generation} " + _names([(x, 0) for x in said])
        if missing:
            text += f", with {_names([(c, 0) for c in missing])} not compiled"
        parts.append(text)
    return "; ".join(parts)


def zoo_bytes(generation):
    """performance.md's table of every variant's bytes over naive's on one generation; bold:
    the fewest of an exact penalty step."""
    variants = ("plain", "fastgp", "fastgp-reverse", "fastgp-remat", "fastgp-dots", "fastgp-pallas")

    def render(results):
        rows = []
        for critic in ("resnet32", "dcgan32", "lnconv32", "stylegan2-64", "vit32", "mlp"):
            cells = {}
            for v in variants:
                ratio = results.bytes_ratio(generation, critic, v)
                cells[v] = "-" if ratio is None else f"{ratio:.3f}x"
            exact = [cells[v] for v in variants[1:] if cells[v] != "-"]
            fewest = min(exact, key=lambda c: float(c[:-1]))
            rows.append(
                [critic]
                + [f"**{c}**" if v != "plain" and c == fewest else c for v, c in cells.items()]
            )
        head = ["critic", *(LABELS[v] for v in variants)]
        head[2] = "default"
        return markdown_table(head, rows)

    return render


def zoo_capacity(results):
    """performance.md's table of the largest batch per v5e chip."""
    rows = []
    for critic in ("resnet32", "dcgan32", "lnconv32", "stylegan2-64", "vit32", "mlp"):
        naive, ours, remat = (
            results.capacity(critic, v) for v in ("naive", "fastgp", "fastgp-remat")
        )
        rows.append(
            [
                critic,
                f"{naive:,}",
                f"{ours:,}",
                f"{ours / naive:.2f}x",
                f"{remat:,}",
                f"{remat / naive:.2f}x",
            ]
        )
    return markdown_table(
        ["critic", "naive", "default", "/ naive", 'remat="nothing"', "/ naive"], rows
    )


# --- the trainer -------------------------------------------------------------------------------

TOY_NAMES = {"8gaussians": "8 Gaussians", "25gaussians": "25 Gaussians"}


def _runs(results, dataset, mode):
    return [r for r in results.train_time["runs"] if (r["dataset"], r["mode"]) == (dataset, mode)]


def train_time(results):
    """docs/trainer.md's table: train_time.json's runs and chunks, per dataset and mode."""
    rows = []
    chunks = {c["dataset"]: c["modes"] for c in results.train_time["chunks"]}
    for dataset, name in TOY_NAMES.items():
        for mode in ("off", "auto"):
            runs = _runs(results, dataset, mode)
            chunk = chunks[dataset][mode]
            rows.append(
                [
                    name,
                    mode,
                    ", ".join(f"{r['train_s']:.1f}" for r in runs),
                    ", ".join(f"{r['cpu_s']:.1f}" for r in runs),
                    f"{chunk['first_chunk_s']:.1f} s (CPU {chunk['first_chunk_cpu_s']:.1f} s)",
                    f"{chunk['wall_ms_per_step']:.2f} / {chunk['cpu_ms_per_step']:.2f}",
                ]
            )
    return markdown_table(
        [
            "run",
            "`--fused`",
            f"train_s ({len(runs)} runs)",
            "CPU s of the command",
            "compile + first 100 steps",
            "wall / CPU ms per step",
        ],
        rows,
    )


def _seconds(values):
    return _range(values, "{:.0f}") + " s"


def toy_runs(results):
    """docs/trainer.md's toy table: the published WGAN-GP figures and train_time.json's runs of
    the default ``--fused``."""
    published = results.trainer_runs["published_wgan_gp"]
    rows = []
    for dataset, name in TOY_NAMES.items():
        runs = _runs(results, dataset, "auto")
        first, paper = runs[0], published[dataset]
        total = first["total_modes"]
        command = (
            "`fastgp train` = `make train`"
            if dataset == "8gaussians"
            else (f"`fastgp train --dataset {dataset}`")
        )
        rows += [
            [
                name,
                "published WGAN-GP (PacGAN paper)",
                f"{paper['modes']} / {total}",
                f"{paper['high_quality']} %",
                "",
            ],
            [
                name,
                f"{command} (seed 0)",
                f"**{first['modes']} / {total}**",
                f"**{first['high_quality']:.1f} %**",
                ", ".join(f"{r['train_s']:.1f}" for r in runs),
            ],
        ]
    head = ["data", "run", "modes", "high quality", "train_s (train_time.json)"]
    return markdown_table(head, rows)


def _digits(results, recipe):
    return [r for r in results.trainer_runs["digits"] if r["recipe"] == recipe]


def trainer_runs(results):
    """README's table of the default runs, seed 0: train_time.json's toy runs (the default
    ``--fused``) and trainer_runs.json's digits run, beside the published WGAN-GP figures."""
    published = results.trainer_runs["published_wgan_gp"]
    rows = []
    for dataset, command in (
        ("8gaussians", "`make train` (8 Gaussians)"),
        ("25gaussians", "`fastgp train --dataset 25gaussians`"),
    ):
        runs = _runs(results, dataset, "auto")
        first, paper = runs[0], published[dataset]
        quality = (
            f"{first['modes']} / {first['total_modes']} modes, {first['high_quality']:.1f} % high "
            f"quality (published WGAN-GP: {paper['modes']} / {first['total_modes']}, "
            f"{paper['high_quality']} %)"
        )
        rows.append([command, quality, _seconds([r["train_s"] for r in runs])])
    (digits,), previous = _digits(results, "default")[:1], _digits(results, "previous")
    m = digits["metric"]
    quality = (
        f"C2ST {m['c2st_accuracy']:.3f} ({LIKE[0]} real + {LIKE[-1]} {m['c2st_sigma']:.3f} "
        f"noise), {FRECHET} {m['frechet_distance']:.2f}, confidence {m['confidence']:.3f}, "
        f"{m['classes_covered']} / 10 classes"
    )
    time = _seconds([digits["train_s"]])
    if previous:
        time += f" (the recipe before: {_seconds([previous[0]['train_s']])} in the same hour)"
    rows.append([f"`fastgp train --dataset digits` (8{TIMES}8)", quality, time])
    return markdown_table(["run", "quality", "train time"], rows)


def _with_floor(value, floor, first):
    return f"{value} ({floor})" if first else value


def digits_runs(results):
    """docs/trainer.md's table of the digits runs of trainer_runs.json."""
    rows = []
    for i, run in enumerate(results.trainer_runs["digits"]):
        m, first = run["metric"], i == 0
        rows.append(
            [
                run["run"],
                _with_floor(f"{m['c2st_accuracy']:.3f}", f"{m['c2st_floor']:.3f}", first),
                f"{m['c2st_sigma']:.3f}",
                _with_floor(
                    f"{m['frechet_distance']:.2f} {PLUS_MINUS} {m['frechet_spread']:.2f}",
                    f"{m['frechet_floor']:.2f}",
                    first,
                ),
                f"{m['frechet_sigma']:.3f}",
                _with_floor(f"{m['confidence']:.3f}", f"{m['confidence_floor']:.3f}", first),
                f"{m['classes_covered']} / 10",
                f"{run['train_s']:.1f} s",
            ]
        )
    head = [
        "run",
        "C2ST (floor)",
        LIKE,
        f"{FRECHET} {PLUS_MINUS} sd (floor)",
        LIKE,
        "confidence (floor)",
        "classes",
        "train time",
    ]
    return markdown_table(head, rows)


# --- the blocks --------------------------------------------------------------------------------

# --- attention ----------------------------------------------------------------------------------


def _oldest_jax(records):
    return tpu_versions.of_oldest(records) if records and "jax" in records[0] else records


def vmem_request(results):
    """performance.md's table: the penalty kernels' steps with a scoped-VMEM request of 3/4 of
    the core's VMEM over the same steps with the request their blocks need."""
    wide = _json_in(results.dir, "tpu/vmem_request_three_quarters.json")["records"]
    key = lambda r: (r["generation"], r["critic"], r["variant"], r["batch"])
    # The wide requests were compiled with the oldest JAX; a source that holds several JAX
    # versions' records (benchmarks/tpu/versions.py) gives that one's.
    need = {
        key(r): r
        for source in sorted({r["source"] for r in wide})
        for r in _oldest_jax(_json_in(results.dir, source))
    }
    rows = [
        [
            r["generation"],
            f"{r['critic']} ({r['batch']})",
            f"{r['bytes'] / need[key(r)]['bytes']:.3f}x",
            f"{need[key(r)]['temp'] / 2**20:.1f} → {r['temp'] / 2**20:.1f}",
        ]
        for r in wide
    ]
    head = ["chip", "critic (batch)", "bytes: 3/4 / need", "temp MiB: need → 3/4"]
    return markdown_table(head, rows)


def attention_tpu(results):
    """performance.md's table of the long-sequence ViT critic steps compiled for TPU chips (the
    R1 steps have their own, ``approximate_r1.tables.long_tpu``)."""
    records = [
        r
        for r in _json_in(results.dir, "attention/attention_tpu.json")
        if not r["variant"].endswith("-r1")
    ]
    order = {g: i for i, g in enumerate(("v5e", "v6e", "v5p", "7x"))}
    rows = []
    for r in sorted(
        records,
        key=lambda r: (order.get(r["generation"], 9), r["variant"], r["tokens"], r["batch"]),
    ):
        if r["fits"]:
            peak = f"{r['peak'] / 2**30:.2f}"
            per_sample = f"{r['peak'] / r['batch'] / 2**20:,.0f}"
            kernels = "yes" if r["kernel"] else "no"
        else:
            reason = "out of HBM" if "RESOURCE_EXHAUSTED" in r["error"] else "does not compile"
            peak, per_sample, kernels = reason, "", ""
        rows.append(
            [
                r["generation"],
                r["variant"],
                f"{r['tokens']:,}",
                str(r["batch"]),
                peak,
                per_sample,
                kernels,
            ]
        )
    return markdown_table(
        ["chip", "attention / penalty", "tokens", "batch", "peak GiB", "MiB per sample", "Mosaic"],
        rows,
    )


def _declared(results):
    from benchmarks.exactness import design

    return {
        testbed: _json_in(results.dir, f"exactness/declared_{testbed}.json")
        for testbed in design.TESTBEDS
        if (pathlib.Path(results.dir) / f"exactness/declared_{testbed}.json").exists()
    }


def exactness_declared(results):
    """performance.md's table of the declared study's comparisons so far (declared.md's)."""
    from benchmarks.exactness import declared_report

    return declared_report.markdown(_declared(results))


def exactness_answer(results):
    """README's answer to what exactness buys: the declared study's primary findings."""
    from benchmarks.exactness import declared_report

    return declared_report.answer(_declared(results))


def attention_sequence_memory_headline(results):
    """README's sentence on the ring's memory per device."""
    from benchmarks.attention import sequence_memory

    return sequence_memory.headline(
        _json_in(results.dir, "attention/sequence_memory.json"),
        _json_in(results.dir, "attention/sequence_memory_h8.json"),
    )


def attention_sequence_memory_schedulers(results):
    """performance.md's sentence on XLA:CPU's two schedulers' memory."""
    from benchmarks.attention import sequence_memory

    return sequence_memory.scheduler_summary(
        _json_in(results.dir, "attention/sequence_memory.json"),
        _json_in(results.dir, "attention/sequence_memory_memory_scheduler.json"),
    )


def attention_second_order(results):
    """performance.md's table of the WGAN-GP step before and after the second-order kernels."""
    from benchmarks.attention import second_order

    now = _json_in(results.dir, "attention/attention_tpu.json")
    before = _json_in(results.dir, "attention/attention_tpu_before.json")["records"]
    return second_order.table(now, before)


# The GPU script's attention runs, oldest first; the capacity search (check.sh --capacity) only
# once it has run.
GPU_ATTENTION = ("gpu/attention_gpu.json", "gpu/attention_gpu_long.json")
GPU_CAPACITY = "gpu/attention_gpu_capacity.json"


def _gpu_attention(results):
    """The GPU script's attention runs as one result (``benchmarks.gpu.attention.merged``)."""
    from benchmarks.gpu import attention as gpu_attention

    names = [*GPU_ATTENTION]
    if (pathlib.Path(results.dir) / GPU_CAPACITY).exists():
        names.append(GPU_CAPACITY)
    return gpu_attention.merged([_json_in(results.dir, name) for name in names])


def attention_auto(results):
    """performance.md's table of the figures behind attention's backend="auto"."""
    from benchmarks.attention import auto

    records = _json_in(results.dir, "attention/attention_tpu.json")
    cpu = _json_in(results.dir, "attention/auto_cpu.json")
    return auto.table(records, cpu, _gpu_attention(results))


def gpu_bandwidth(results):
    """performance.md's table of the penalty's Triton kernel against XLA and a copy on a GPU
    (``benchmarks.gpu.bandwidth`` writes it as markdown: its table lines)."""
    text = (pathlib.Path(results.dir) / "gpu/gpu_bandwidth.md").read_text()
    return [line for line in text.splitlines() if line.startswith("|")]


def attention_gpu(results):
    """performance.md's table of the long ViT's steps through each attention on a GPU."""
    from benchmarks.gpu import attention as gpu_attention

    return gpu_attention.table_lines(_gpu_attention(results))


class Block(NamedTuple):
    """A quoted block: ``render(results)`` -> its lines (a table) or a string (a sentence), and
    the results files, as paths under RESULTS, it reads."""

    render: Callable[[Any], Any]
    sources: tuple[str, ...]


def _study_table(module: str, source: str, function: str = "table", **kwargs: Any) -> "Block":
    """The block that a study renders from its one results file: ``benchmarks.<module>``'s
    ``function`` (imported when first rendered) on ``source`` loaded, with ``kwargs``."""

    def render(results: Any) -> Any:
        study = importlib.import_module(f"benchmarks.{module}")
        return getattr(study, function)(_json_in(results.dir, source), **kwargs)

    return Block(render, (source,))


# Every block the pages quote: how it renders, and the results files it is rendered from (paths
# under RESULTS).
BLOCKS = {
    "exactness-study-vit": Block(exactness_tables.study("vit"), ("exactness/study_vit.json",)),
    "exactness-study-conv": Block(exactness_tables.study("conv"), ("exactness/study_conv.json",)),
    "exactness-steptime-conv": Block(
        exactness_tables.steptime("conv"), ("exactness/steptime_conv.json",)
    ),
    "exactness-steptime-vit": Block(
        exactness_tables.steptime("vit"), ("exactness/steptime_vit.json",)
    ),
    "exactness-sigma": Block(exactness_tables.sigma, ("exactness/sigma.json",)),
    "exactness-compiled": Block(exactness_tables.compiled, ("exactness/compiled.json",)),
    "check-isa": Block(exactness_tables.check_isa, ("training/check_isa.json",)),
    "approximate-r1-ratios": Block(
        approximate_r1_tables.ratios, ("approximate_r1/approximate_r1.json",)
    ),
    "approximate-r1-gradients": Block(
        approximate_r1_tables.gradients, ("approximate_r1/approximate_r1_gradients.json",)
    ),
    "approximate-r1-cost": Block(
        approximate_r1_tables.cost,
        (
            "approximate_r1/approximate_r1.json",
            "approximate_r1/approximate_r1_tpu.json",
            "approximate_r1/approximate_r1_tpu_capacity.json",
        ),
    ),
    "approximate-r1-training": Block(
        approximate_r1_tables.training, ("approximate_r1/approximate_r1_training.json",)
    ),
    "approximate-r1-long-tpu": Block(
        approximate_r1_tables.long_tpu, ("attention/attention_tpu.json",)
    ),
    "approximate-r1-long-cpu": Block(
        approximate_r1_tables.long_cpu, ("approximate_r1/long_sequences.json",)
    ),
    "approximate-r1-transformer-training": Block(
        approximate_r1_tables.transformer_training, ("approximate_r1/transformer_training.json",)
    ),
    "exact-over-approximate": Block(
        approximate_r1_tables.exact_over_approximate,
        (
            "attention/attention_tpu.json",
            "approximate_r1/long_sequences.json",
            "approximate_r1/transformer_training.json",
        ),
    ),
    "toy-tpu": _study_table("tpu.compile", "tpu/tpu_compile.json"),
    "toy-tpu-versions": _study_table("tpu.compile", "tpu/tpu_compile.json", "versions_summary"),
    "sharded-tpu": _study_table("tpu.sharded_compile", "tpu/tpu_sharded_compile.json"),
    "sharded-tpu-versions": _study_table(
        "tpu.sharded_compile", "tpu/tpu_sharded_compile.json", "versions_summary"
    ),
    "vmem-request": Block(
        vmem_request,
        (
            "tpu/vmem_request_three_quarters.json",
            "zoo/zoo_tpu.json",
            "tpu/tpu_compile.json",
        ),
    ),
    "attention-tpu": Block(attention_tpu, ("attention/attention_tpu.json",)),
    "attention-sequence-tpu": _study_table("attention.sequence_tpu", "attention/sequence_tpu.json"),
    "attention-sequence-tpu-ring": _study_table(
        "attention.sequence_tpu", "attention/sequence_tpu.json", scheme="ring"
    ),
    "attention-sequence-tpu-all-to-all": _study_table(
        "attention.sequence_tpu", "attention/sequence_tpu.json", shards=(4,), scheme="all-to-all"
    ),
    "attention-jvp-memory": _study_table("attention.jvp_memory", "attention/jvp_memory.json"),
    "attention-sequence-memory": _study_table(
        "attention.sequence_memory", "attention/sequence_memory.json"
    ),
    "attention-sequence-memory-auto-jit": _study_table(
        "attention.sequence_memory", "attention/sequence_memory_h8.json", "auto_jit_summary"
    ),
    "attention-sequence-memory-floors": _study_table(
        "attention.sequence_memory", "attention/sequence_memory.json", "floor_summary"
    ),
    "attention-sequence-memory-scheduler": _study_table(
        "attention.sequence_memory", "attention/sequence_memory_memory_scheduler.json"
    ),
    "attention-sequence-memory-scheduler-floors": _study_table(
        "attention.sequence_memory",
        "attention/sequence_memory_memory_scheduler.json",
        "floor_summary",
    ),
    "attention-sequence-memory-schedulers": Block(
        attention_sequence_memory_schedulers,
        ("attention/sequence_memory.json", "attention/sequence_memory_memory_scheduler.json"),
    ),
    "exactness-recipe-runs": _study_table("exactness.recipe_run", "exactness/recipe_runs.json"),
    "exactness-declared": Block(exactness_declared, ("exactness/declared_vit.json",)),
    "exactness-answer": Block(exactness_answer, ("exactness/declared_vit.json",)),
    "attention-sequence-memory-heads": _study_table(
        "attention.sequence_memory", "attention/sequence_memory_h8.json"
    ),
    "attention-sequence-time-heads": _study_table(
        "attention.sequence_memory", "attention/sequence_time_h8.json"
    ),
    "attention-sequence-axes": _study_table(
        "attention.sequence_axes", "attention/sequence_axes.json"
    ),
    "attention-sequence-axes-tpu": _study_table(
        "attention.sequence_axes", "attention/sequence_axes_tpu.json", function="tpu_table"
    ),
    "attention-sequence-axes-time": _study_table(
        "attention.sequence_axes", "attention/sequence_axes_time.json"
    ),
    "attention-sequence-memory-tpu": _study_table(
        "attention.sequence_memory", "attention/sequence_memory_tpu.json", function="tpu_table"
    ),
    "attention-sequence-memory-headline": Block(
        attention_sequence_memory_headline,
        (
            "attention/sequence_memory.json",
            "attention/sequence_memory_h8.json",
        ),
    ),
    "attention-ring-overlap": _study_table("attention.ring_overlap", "attention/ring_overlap.json"),
    "attention-auto": Block(
        attention_auto, ("attention/attention_tpu.json", "attention/auto_cpu.json", *GPU_ATTENTION)
    ),
    "attention-gpu": Block(attention_gpu, GPU_ATTENTION),
    "attention-step-time": _study_table("attention.step_time", "attention/step_time_cpu.json"),
    "gpu-bandwidth": Block(gpu_bandwidth, ("gpu/gpu_bandwidth.md",)),
    "attention-second-order": Block(
        attention_second_order,
        (
            "attention/attention_tpu.json",
            "attention/attention_tpu_before.json",
        ),
    ),
    "zoo-headline": Block(zoo_headline, ("suites/bench.json", "zoo/zoo_tpu.json")),
    "zoo-summary": Block(
        zoo_summary, ("suites/bench.json", "zoo/zoo_tpu.json", "zoo/zoo_capacity.json")
    ),
    "zoo-cpu": Block(zoo_cpu, ("suites/bench.json",)),
    "zoo-pallas": Block(zoo_pallas, ("zoo/zoo_tpu.json",)),
    "zoo-bytes-v5e": Block(
        zoo_bytes("v5e"), ("zoo/zoo_tpu.json", "zoo/zoo_capacity_compiles.json")
    ),
    "zoo-bytes-v6e": Block(zoo_bytes("v6e"), ("zoo/zoo_tpu.json",)),
    "zoo-capacity": Block(zoo_capacity, ("zoo/zoo_capacity.json",)),
    "toy-runs": Block(toy_runs, ("training/train_time.json", "training/trainer_runs.json")),
    "train-time": Block(train_time, ("training/train_time.json",)),
    "trainer-runs": Block(trainer_runs, ("training/train_time.json", "training/trainer_runs.json")),
    "digits-runs": Block(digits_runs, ("training/trainer_runs.json",)),
}


def render(name, results=None):
    """Block ``name`` as the pages hold it: a table on lines of its own (a newline either side),
    a sentence inline."""
    text = BLOCKS[name].render(results or Results())
    return text if isinstance(text, str) else "\n" + "\n".join(text) + "\n"


def quoted(page):
    """[(name, the text between its marks)] of every marked block of a page."""
    return MARK.findall(pathlib.Path(page).read_text(encoding="utf-8"))


def rewrite(page, results=None):
    """Replace every marked block of ``page`` with its rendering; True if the page changed."""
    results = results or Results()
    path = pathlib.Path(page)
    text = path.read_text(encoding="utf-8")
    new = MARK.sub(
        lambda m: f"<!-- results:{m[1]} -->{render(m[1], results)}<!-- /results:{m[1]} -->", text
    )
    if new != text:
        path.write_text(new, encoding="utf-8")
    return new != text


def main(argv=None):
    parser = harness.parser(__doc__)
    parser.add_argument(
        "--write", action="store_true", help="rewrite the marked blocks of README.md and docs/"
    )
    args = parser.parse_args(argv)
    results = Results()
    if args.write:
        for page in PAGES:
            if rewrite(page, results):
                print(f"rewrote {page.relative_to(ROOT)}", file=sys.stderr)
        return 0
    for name in BLOCKS:
        print(f"{name}:\n{render(name, results)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
