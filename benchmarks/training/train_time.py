"""`make train`'s job and the 25-Gaussian run: the previous CPU path against the current choice.

    JAX_PLATFORMS=cpu python -m benchmarks.training.train_time [--repeats 2] [--datasets ...]
    -> benchmarks/results/training/train_time.md and train_time.json

Each run is the full default recipe as ``make train`` runs it (``fastgp train --dataset D
--no-progress`` in a fresh --out), once with ``--fused off`` (every CPU run's path before: one
compiled iteration per dispatch, the critic steps written out) and once with ``--fused auto``
(the default: one fused ``lax.scan`` per chunk for the MLP pairs). The two alternate within each
repeat (off, auto, then auto, off), so the load of this shared machine hits both alike; the
1-minute load average is recorded before and after every run.

Per run: ``train_s`` from summary.json (training only: compilation, evaluations and checkpoints
included, start-up and the final figure excluded), steps/s = steps / train_s, the wall time to
the first log point (compilation plus 100 steps), the steady steps/s after it (metrics.jsonl),
the CPU seconds of the whole command (user + sys; less sensitive to the neighbours' load than
wall time), and the final quality (modes, % high quality). ``meets``: every mode, >= 90 % high
quality and train_s <= 120 s.

Whole runs minutes apart meet different loads, so the script then times the two paths in ONE
process, chunk against chunk (``--rounds``): both trainers of a dataset's recipe, the first
chunk (compilation plus 100 steps) of each, then 100-iteration chunks of the two alternating,
wall and CPU time per chunk with the load; medians and the median of the paired ratios.
"""

import json
import os
import pathlib
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import benchmarks
from benchmarks import harness, records
from benchmarks.tables import markdown_table

MODES = {"off": "unfused (previous CPU path)", "auto": "auto (new default)"}
ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULTS = benchmarks.RESULTS / "training"
BUDGET_S = 120.0
MIN_HIGH_QUALITY = 90.0


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _child_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def train_once(dataset: str, mode: str) -> dict:
    """One default run of ``dataset`` with ``--fused mode``; its figures."""
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "run"
        cmd = [sys.executable, "-m", "fastgp.train.cli", "train", "--dataset", dataset]
        cmd += ["--fused", mode, "--out", str(out), "--no-progress"]
        env = {**os.environ, "JAX_PLATFORMS": "cpu"}
        load_before, cpu_before, start = _load(), _child_cpu_s(), time.perf_counter()
        subprocess.run(cmd, check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
        command_s = time.perf_counter() - start
        cpu_s, load_after = _child_cpu_s() - cpu_before, _load()
        summary = json.loads((out / "summary.json").read_text())
        fused = json.loads((out / "run.json").read_text())["fused"]
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    first, last = records[0], records[-1]
    steady = (last["step"] - first["step"]) / (last["wall_s"] - first["wall_s"])
    train_s = summary["train_s"]
    return {
        "dataset": dataset,
        "mode": mode,
        "fused": fused,
        "steps": summary["steps"],
        "train_s": train_s,
        "steps_per_s": round(summary["steps"] / train_s, 1),
        "first_log_s": round(first["wall_s"], 1),
        "first_log_step": first["step"],
        "steady_steps_per_s": round(steady, 1),
        "command_s": round(command_s, 1),
        "cpu_s": round(cpu_s, 1),
        "modes": summary["modes"],
        "total_modes": summary["total_modes"],
        "high_quality": summary["high_quality"],
        "meets": bool(
            summary["modes"] == summary["total_modes"]
            and summary["high_quality"] >= MIN_HIGH_QUALITY
            and train_s <= BUDGET_S
        ),
        "load_before": load_before,
        "load_after": load_after,
    }


def _paired_median(per_chunk: dict, key: str) -> float:
    """The median over paired chunks of auto's ``key`` over off's."""
    pairs = zip(per_chunk["auto"], per_chunk["off"], strict=True)
    return statistics.median(a[key] / b[key] for a, b in pairs)


def _chunk_summary(first: dict, chunks: list, chunk: int) -> dict:
    """One mode's first chunk and its medians per step over the timed chunks."""
    return {
        "first_chunk_s": round(first["wall_s"], 2),
        "first_chunk_cpu_s": round(first["cpu_s"], 2),
        "wall_ms_per_step": round(1e3 * statistics.median(c["wall_s"] for c in chunks) / chunk, 2),
        "cpu_ms_per_step": round(1e3 * statistics.median(c["cpu_s"] for c in chunks) / chunk, 2),
        "load_median": round(statistics.median(c["load"] for c in chunks), 2),
    }


def chunk_costs(dataset: str, rounds: int, chunk: int = 100, flip: bool = False) -> dict:
    """Both paths of ``dataset``'s recipe in this process, ``chunk`` iterations at a time
    (``flip``: the unfused path's first chunk second, so compilation order alternates)."""
    import jax

    from fastgp.train.recipes.defaults import build_problem, default_config
    from fastgp.train.trainers.trainer import Trainer, make_mesh

    config = default_config(dataset, backend="xla")
    problem = build_problem(dataset, config)
    models = problem.generator, problem.critic, problem.sample_real
    mesh = make_mesh(jax.devices()[:1])
    trainers = {mode: Trainer(config, *models, mesh=mesh, fused=mode == "auto") for mode in MODES}
    auto = Trainer(config, *models, mesh=mesh).fused
    states = {mode: trainer.init() for mode, trainer in trainers.items()}
    first: dict = {}
    per_chunk: dict = {mode: [] for mode in MODES}

    def timed(mode):
        load, cpu, start = _load(), time.process_time(), time.perf_counter()
        states[mode], metrics = trainers[mode].run(states[mode], chunk)
        jax.block_until_ready((states[mode], metrics))
        wall = time.perf_counter() - start
        return {"wall_s": wall, "cpu_s": time.process_time() - cpu, "load": load}

    for mode in list(MODES)[::-1] if flip else list(MODES):
        first[mode] = timed(mode)
    for i in range(rounds):
        for mode in list(MODES) if i % 2 == 0 else list(MODES)[::-1]:
            per_chunk[mode].append(timed(mode))
    ratio = _paired_median(per_chunk, "wall_s")
    ratio_cpu = _paired_median(per_chunk, "cpu_s")
    summary = {
        mode: _chunk_summary(first[mode], chunks, chunk) for mode, chunks in per_chunk.items()
    }
    return {
        "dataset": dataset,
        "auto_fused": auto,
        "chunk": chunk,
        "rounds": rounds,
        "modes": summary,
        "wall_ratio_auto_over_off": round(ratio, 3),
        "cpu_ratio_auto_over_off": round(ratio_cpu, 3),
        "chunks": per_chunk,
        "first": first,
    }


def _runs_table(runs: list) -> list[str]:
    """Every run in the order run."""
    rows = [
        [
            i,
            r["dataset"],
            r["mode"],
            r["fused"],
            f"{r['train_s']:.1f}",
            f"{r['steps_per_s']:.1f}",
            f"{r['first_log_s']:.1f} s",
            f"{r['steady_steps_per_s']:.1f}",
            f"{r['cpu_s']:.1f}",
            f"{r['modes']}/{r['total_modes']}",
            f"{r['high_quality']:.2f} %",
            "yes" if r["meets"] else "no",
            f"{r['load_before']:.2f} -> {r['load_after']:.2f}",
        ]
        for i, r in enumerate(runs, 1)
    ]
    head = [
        "#",
        "dataset",
        "--fused",
        "fused",
        "train_s",
        "steps/s",
        "first log",
        "steady steps/s",
        "CPU s",
        "modes",
        "high quality",
        "meets",
        "load",
    ]
    return markdown_table(head, rows)


def _medians_table(runs: list, datasets: list[str]) -> list[str]:
    """The medians per dataset and mode."""
    rows = []
    for dataset in datasets:
        for mode, label in MODES.items():
            rs = [r for r in runs if r["dataset"] == dataset and r["mode"] == mode]
            if not rs:
                continue

            def med(key, rs=rs):
                return statistics.median(r[key] for r in rs)

            rows.append(
                [
                    dataset,
                    label,
                    len(rs),
                    *(f"{med(k):.1f}" for k in ("train_s", "steps_per_s", "steady_steps_per_s")),
                    f"{med('cpu_s'):.1f}",
                    f"{med('high_quality'):.2f} %",
                    f"{med('load_before'):.2f}",
                ]
            )
    head = [
        "dataset",
        "mode",
        "runs",
        "train_s",
        "steps/s",
        "steady steps/s",
        "CPU s",
        "high quality",
        "load before",
    ]
    return markdown_table(head, rows)


def _chunks_section(chunks) -> list[str]:
    """The in-process chunk comparison."""
    lines = [
        "",
        (
            f"The same paths in one process, {chunks[0]['chunk']}-step chunks alternating "
            f"({chunks[0]['rounds']} rounds per mode after each one's first chunk; medians):"
        ),
        "",
    ]
    rows = []
    for c in chunks:
        for mode, label in MODES.items():
            m = c["modes"][mode]
            rows.append(
                [
                    c["dataset"],
                    label,
                    mode == "auto" and c["auto_fused"],
                    f"{m['first_chunk_s']:.1f} s (CPU {m['first_chunk_cpu_s']:.1f} s)",
                    f"{m['wall_ms_per_step']:.2f}",
                    f"{m['cpu_ms_per_step']:.2f}",
                    f"{m['load_median']:.2f}",
                ]
            )
    head = [
        "dataset",
        "mode",
        "fused",
        "first chunk (compile + 100 steps)",
        "wall ms/step",
        "CPU ms/step",
        "load",
    ]
    lines += markdown_table(head, rows)
    lines += [""] + [
        f"{c['dataset']}: auto / off per paired chunk, median: wall "
        f"{c['wall_ratio_auto_over_off']:.3f}, CPU {c['cpu_ratio_auto_over_off']:.3f}."
        for c in chunks
    ]
    return lines


def report(runs: list, args, meta: dict, chunks=()) -> str:
    """The markdown page: every run in the order run, the medians per dataset and mode, then the
    in-process chunk comparison."""
    lines = [
        "# Training time of the default runs: unfused against the default choice",
        "",
        (
            f"`{meta['command']}` on {meta['machine']}, commit {meta['commit']}: "
            "`fastgp train --dataset D --fused {off,auto}` with the dataset's recipe, the two "
            "modes alternating (off, auto, then auto, off) within each repeat. train_s is "
            "summary.json's (compilation, evaluations and checkpoints included; start-up and the "
            "final figure excluded); first log = wall time to step 100 (compilation plus 100 "
            "steps); steady = steps/s after it; CPU s = user + sys of the whole command; load = "
            "the 1-minute load average before -> after the run (2 cores, shared). meets: every "
            f"mode, >= {MIN_HIGH_QUALITY:.0f} % high quality, train_s <= {BUDGET_S:.0f} s."
        ),
        "",
    ]
    lines += [*_runs_table(runs), "", "Medians per dataset and mode:", ""]
    lines += _medians_table(runs, args.datasets)
    if chunks:
        lines += _chunks_section(chunks)
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = harness.parser(__doc__)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--datasets", nargs="+", default=["8gaussians", "25gaussians"])
    parser.add_argument("--rounds", type=int, default=20, help="chunks per mode in one process")
    parser.add_argument("--results", type=pathlib.Path, default=RESULTS)
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    command = "python -m benchmarks.training.train_time" + (
        f" --repeats {args.repeats}" if args.repeats != 2 else ""
    )
    if args.rounds != 20:
        command += f" --rounds {args.rounds}"
    if args.datasets != ["8gaussians", "25gaussians"]:
        command += " --datasets " + " ".join(args.datasets)
    meta = {
        "command": command,
        "machine": f"{os.cpu_count()} CPU cores, {platform.machine()}, Python "
        f"{platform.python_version()}",
        "commit": records.provenance()["commit"] or "unknown",
    }
    runs: list = []
    chunks: list = []
    args.results.mkdir(parents=True, exist_ok=True)

    def write():
        # After every measurement: an interrupted benchmark keeps what it measured.
        (args.results / "train_time.json").write_text(
            json.dumps({**meta, "runs": runs, "chunks": chunks}, indent=1) + "\n"
        )
        (args.results / "train_time.md").write_text(report(runs, args, meta, chunks))

    for repeat in range(args.repeats):
        for dataset in args.datasets:
            modes = list(MODES) if repeat % 2 == 0 else list(MODES)[::-1]
            for mode in modes:
                runs.append(train_once(dataset, mode))
                print(json.dumps(runs[-1]), flush=True)
                write()
    if args.rounds:
        for i, dataset in enumerate(args.datasets):
            chunks.append(chunk_costs(dataset, args.rounds, flip=i % 2 == 1))
            print(json.dumps({k: v for k, v in chunks[-1].items() if k != "chunks"}), flush=True)
            write()
    print(report(runs, args, meta, chunks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
