"""The declared study of docs/study.md (``benchmarks.exactness.design``): its runs one at a time,
resumable, each checked against its arm's declaration; the pilot's seed count.

    JAX_PLATFORMS=cpu python -m benchmarks.exactness.declared run --testbed vit --seeds 4
        [--runs-dir runs/declared] [--max-runs N]
    JAX_PLATFORMS=cpu python -m benchmarks.exactness.declared pilot
    JAX_PLATFORMS=cpu python -m benchmarks.exactness.declared status --testbed vit --seeds N
    JAX_PLATFORMS=cpu python -m benchmarks.exactness.declared report [--runs-dir runs/declared]
    -> runs/declared/declared_<testbed>.json as the runs go (live, untracked); ``report``
       publishes them to benchmarks/results/exactness/ with declared.md

``run`` executes ``design.plan`` for the testbed up to ``--seeds`` seeds, in its order, one
``fastgp train`` at a time (the clock of a run is read with nothing else training). Every run
already in the results file must still be its arm's declaration (a recipe changed since makes a new
study, never a pooled one: ``UndeclaredConfig``), and is skipped; a run that has not trained all
its steps (killed, or stopped by a signal, whose summary says ``stopped_by``) continues from its
newest checkpoint (``--resume``), and one that ended before the study could record it is recorded,
so the study goes on where it stopped. Before a run starts, the configuration its flags resolve to
must equal its declaration: the testbed's recipe (``fastgp train --dataset mnist --critic C``,
never a recipe taken by name), the run's seed, the backend and the arm's fields; the run's own
run.json is checked again when it ends (``UndeclaredConfig`` names each field that differs). Each
recorded run keeps its resolved configuration, every commit that trained it (run.json's
``code``), its evaluations and its final quality.

The study runs for hours: run it from a checkout that stays at one commit (``git worktree add``,
with its own environment), so that work beside it never reaches a run, and point ``--runs-dir``
at one folder that outlives the checkout; each run records every commit that trained it.

``pilot`` reads the first ``design.PILOT_SEEDS`` seeds of P1 and P2 and prints the standard
deviation of their paired log differences and the seed count it sets (``analysis.seeds_needed``).
"""

import dataclasses
import json
import math
import os
import pathlib
import subprocess
import sys
from typing import Any

import numpy as np

import benchmarks
from benchmarks import harness, records
from benchmarks.exactness import analysis, design
from benchmarks.exactness.declarations import (
    UndeclaredConfig,
    differences,
    flags_of,
    plain,
    resolved_run,
)
from fastgp.train.config import TrainConfig
from fastgp.train.recipes.defaults import recipe

RESULTS = benchmarks.RESULTS / "exactness"
RUNS_DIR = pathlib.Path("runs") / "declared"


def results_file(testbed: str, runs_dir: pathlib.Path | None = None) -> pathlib.Path:
    """The testbed's results: the published file in benchmarks/results, or with ``runs_dir`` the
    live one the runs append to there (outside the tracked tree, so that a run's own record never
    makes the next run's checkout dirty)."""
    return (RESULTS if runs_dir is None else runs_dir) / f"declared_{testbed}.json"


def base_fields(testbed: str) -> dict[str, Any]:
    """The recipe of (mnist, the testbed's critic) with its steps: the dataset's own."""
    chosen = recipe(design.DATASET, design.TESTBEDS[testbed].critic)
    return {**chosen.fields, "total_steps": chosen.steps}


def arm_of(testbed: str, arm: str) -> dict[str, Any]:
    """The fields ``arm`` sets on ``testbed``, at the recipe's R1 weight."""
    return design.arm_fields(arm, base_fields(testbed)["gp_weight"])


def declared_config(testbed: str, arm: str, seed: int) -> dict[str, Any]:
    """Every ``TrainConfig`` field of one run as declared, as run.json records it."""
    own = {"critic": design.TESTBEDS[testbed].critic, "seed": seed, "backend": design.BACKEND}
    fields = {**base_fields(testbed), **own, **arm_of(testbed, arm)}
    return plain(dataclasses.asdict(TrainConfig(**fields)))


def _evaluation_every(steps: int) -> int:
    """Generator steps between a run's evaluations (and checkpoints): ``design.EVALUATIONS`` of
    them in its ``steps``."""
    return steps // design.EVALUATIONS


def run_argv(testbed: str, arm: str, seed: int) -> list[str]:
    """The ``fastgp train`` flags of one run: dataset, critic, seed, steps, the arm's flags, the
    backend and the cadence (``design.EVALUATIONS`` evaluations, a checkpoint at each)."""
    steps = base_fields(testbed)["total_steps"]
    every = str(_evaluation_every(steps))
    critic = design.TESTBEDS[testbed].critic
    argv = ["--dataset", design.DATASET, "--critic", critic, "--seed", str(seed)]
    argv += ["--steps", str(steps), *flags_of(arm_of(testbed, arm)), "--backend", design.BACKEND]
    return [*argv, "--log-every", every, "--eval-every", every, "--checkpoint-every", every]


def check_declared(testbed: str, arm: str, seed: int, run: dict[str, Any]) -> None:
    """Raise UndeclaredConfig unless ``run`` (dataset and config, as run.json holds them) is
    the declared run of ``arm`` on ``testbed`` with ``seed``."""
    declared = {"dataset": design.DATASET, **declared_config(testbed, arm, seed)}
    found = differences(declared, {"dataset": run.get("dataset"), **run["config"]})
    if found:
        raise UndeclaredConfig(f"{testbed}, {arm}, seed {seed}", found)


def load(testbed: str, runs_dir: pathlib.Path = RUNS_DIR) -> dict[str, Any]:
    """The testbed's results so far: the live file in ``runs_dir``, else the published one, else
    an empty study."""
    for path in (results_file(testbed, runs_dir), results_file(testbed)):
        if path.exists():
            return json.loads(path.read_text())
    return {"testbed": testbed, "design": "docs/study.md", "runs": []}


def recorded(result: dict[str, Any]) -> set[tuple[str, int]]:
    return {(r["arm"], r["seed"]) for r in result["runs"]}


def collect(out: pathlib.Path, testbed: str, arm: str, seed: int, failure: str | None) -> dict:
    """One finished run's record from its output folder: declaration checked, configuration,
    commits, evaluations, final quality and time. ``failure`` is the stderr of a run that
    failed: a non-finite stop is recorded as a collapse (``analysis.stopped_primary``); any
    other failure raises RuntimeError and records nothing, so the next ``run`` continues it."""
    run_json = json.loads((out / "run.json").read_text())
    check_declared(testbed, arm, seed, run_json)
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evaluations = [
        {k: line[k] for k in ("step", "frechet_distance", "classes_covered", "c2st_accuracy")}
        for line in lines
        if "frechet_distance" in line
    ]
    steps = [e["step"] for e in evaluations]
    if steps != sorted(set(steps)):
        raise ValueError(
            f"{out}: its metrics.jsonl evaluates steps {steps}, not once each in order (two "
            "trainers wrote into one folder?); the run is not added: remove the folder and rerun"
        )
    record = {
        "testbed": testbed,
        "arm": arm,
        "seed": seed,
        "config": run_json["config"],
        "code": run_json["code"],
        "evaluations": evaluations,
    }
    if failure is not None:
        if "training diverged" not in failure:
            raise RuntimeError(
                f"{out} failed, not on a non-finite value, so it is not recorded; fix the cause "
                f"and run the study again, which continues it from its checkpoint: {failure}"
            )
        every = _evaluation_every(record["config"]["total_steps"])
        planned = [every * (i + 1) for i in range(design.EVALUATIONS)]
        record["nonfinite"] = failure
        record["primary"] = analysis.stopped_primary(evaluations, planned)
        record["collapsed"] = True
        return record
    if not ended(out):
        raise RuntimeError(
            f"{out} stopped before its last step, so it is not recorded; run the study again, "
            "which continues it from its checkpoint"
        )
    summary = json.loads((out / "summary.json").read_text())
    keep = ("steps", "train_s", "frechet_distance", "classes_covered", "c2st_accuracy")
    record.update({k: summary[k] for k in keep})
    record["primary"] = analysis.primary_metric(evaluations)
    record["collapsed"] = analysis.collapsed(record)
    return record


def ended(out: pathlib.Path) -> bool:
    """Whether the run in ``out`` trained all its steps: a summary that no signal stopped early
    (a stopped run writes one too, with ``stopped_by``, and continues with ``--resume``)."""
    path = out / "summary.json"
    if not path.exists():
        return False
    summary = json.loads(path.read_text())
    return "stopped_by" not in summary and summary["steps"] == summary["total_steps"]


def train(out: pathlib.Path, argv: list[str]) -> str | None:
    """Run (or continue) one ``fastgp train`` into ``out``; None, or its stderr's end on a
    failure."""
    resume = (out / "run.json").exists() and not ended(out)
    fastgp = str(pathlib.Path(sys.executable).with_name("fastgp"))
    command = [fastgp, "train", *argv, "--no-progress", "--out", str(out)]
    command += ["--resume"] if resume else []
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    return None if proc.returncode == 0 else proc.stderr.decode()[-2000:]


def run(testbed: str, seeds: int, runs_dir: pathlib.Path, max_runs: int | None) -> int:
    """Execute the testbed's plan up to ``seeds`` seeds, skipping recorded runs; each new run
    is checked before it starts and recorded when it ends."""
    result = load(testbed, runs_dir)
    for earlier in result["runs"]:  # the recipe or a declaration changed since: a new study
        check_declared(testbed, earlier["arm"], earlier["seed"], {"dataset": "mnist", **earlier})
    done = recorded(result)
    todo = [p for p in design.plan({testbed: seeds}) if (p[1], p[2]) not in done]
    for _, arm, seed in todo[:max_runs]:
        argv = run_argv(testbed, arm, seed)
        check_declared(testbed, arm, seed, resolved_run(argv))
        out = runs_dir / f"{testbed}-{arm}-{seed}"
        failure = None if ended(out) else train(out, argv)  # ended: the runner stopped after it
        if failure is not None and not (out / "metrics.jsonl").exists():
            raise RuntimeError(f"{testbed}, {arm}, seed {seed} did not start: {failure}")
        record = collect(out, testbed, arm, seed, failure)
        result["runs"].append(record)
        result.update(records.provenance())
        live = results_file(testbed, runs_dir)
        live.parent.mkdir(parents=True, exist_ok=True)
        live.write_text(json.dumps(result, indent=1) + "\n")
        print(json.dumps({k: record.get(k) for k in ("arm", "seed", "primary", "collapsed")}))
    return 0


def status(testbed: str, seeds: int, runs_dir: pathlib.Path = RUNS_DIR) -> dict[str, Any]:
    """How far the testbed's plan up to ``seeds`` seeds has got: runs recorded and left, those
    left that have started (a folder with run.json), the median minutes a recorded run trained
    and the hours the rest would take at that pace (None before any run is recorded)."""
    result = load(testbed, runs_dir)
    done = recorded(result)
    todo = [
        (arm, seed) for _, arm, seed in design.plan({testbed: seeds}) if (arm, seed) not in done
    ]
    started = [
        f"{testbed}-{arm}-{seed}"
        for arm, seed in todo
        if (runs_dir / f"{testbed}-{arm}-{seed}" / "run.json").exists()
    ]
    trained = [r["train_s"] / 60 for r in result["runs"] if "train_s" in r]
    minutes = float(np.median(trained)) if trained else None
    return {
        "testbed": testbed,
        "seeds": seeds,
        "recorded": len(done),
        "left": len(todo),
        "started": started,
        "minutes_per_run": minutes,
        "hours_left": None if minutes is None else round(len(todo) * minutes / 60, 1),
    }


def pilot_sd(result: dict[str, Any]) -> dict[str, float]:
    """Per primary comparison, the sd of log(first / second) over the pilot seeds both arms
    recorded without failing; NaN where fewer than 2 such seeds."""
    by = {(r["arm"], r["seed"]): r for r in result["runs"] if "primary" in r}
    out = {}
    for c in design.COMPARISONS:
        if c.testbed != result["testbed"] or not c.name.startswith("P"):
            continue
        diffs = [
            math.log(by[c.first, s]["primary"] / by[c.second, s]["primary"])
            for s in range(design.PILOT_SEEDS)
            if (c.first, s) in by and (c.second, s) in by
        ]
        out[c.name] = float(np.std(diffs, ddof=1)) if len(diffs) >= 2 else math.nan
    return out


def write_report(runs_dir: pathlib.Path = RUNS_DIR) -> pathlib.Path:
    """Publish: each testbed's results so far (live in ``runs_dir``, else as published) into
    benchmarks/results/exactness/declared_<testbed>.json, and declared.md with its figures
    (``declared_report.page``)."""
    from benchmarks.exactness import declared_report

    results = {t: load(t, runs_dir) for t in design.TESTBEDS}
    results = {t: r for t, r in results.items() if r["runs"]}
    for testbed, result in results.items():
        results_file(testbed).write_text(json.dumps(result, indent=1) + "\n")
    path = RESULTS / "declared.md"
    path.write_text("\n".join(declared_report.page(results, RESULTS)))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    go = sub.add_parser("run", help="run the plan, resuming")
    go.add_argument("--testbed", choices=tuple(design.TESTBEDS), default="vit")
    go.add_argument("--seeds", type=int, required=True, help="seeds per arm")
    go.add_argument("--runs-dir", type=pathlib.Path, default=RUNS_DIR)
    go.add_argument("--max-runs", type=int, help="stop after this many new runs")
    sub.add_parser("pilot", help="the pilot's sd and the seed count it sets")
    where = sub.add_parser("status", help="runs recorded and left, and the hours left")
    where.add_argument("--testbed", choices=tuple(design.TESTBEDS), default="vit")
    where.add_argument("--seeds", type=int, required=True, help="seeds per arm")
    where.add_argument("--runs-dir", type=pathlib.Path, default=RUNS_DIR)
    report = sub.add_parser("report", help="publish the results and declared.md")
    report.add_argument("--runs-dir", type=pathlib.Path, default=RUNS_DIR)
    args = parser.parse_args(argv)
    if args.command == "run":
        return run(args.testbed, args.seeds, args.runs_dir, args.max_runs)
    if args.command == "report":
        write_report(args.runs_dir)
        return 0
    if args.command == "status":
        print(json.dumps(status(args.testbed, args.seeds, args.runs_dir)))
        return 0
    sds = pilot_sd(load("vit"))
    largest = max(sds.values())
    print(json.dumps({"sd": sds, "seeds": analysis.seeds_needed(largest)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
