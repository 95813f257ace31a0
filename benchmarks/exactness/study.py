"""What exactness buys: exact against approximate R1 (and R2) in training, on MNIST at 28 x 28.

    JAX_PLATFORMS=cpu python -m benchmarks.exactness.study [--critic vit] [--seeds 0 1 2]
        [--rows r3gan apt-r1r2 eps2-r1r2 stylegan2-lazy apt wgan-gp] [--budget 300]
        [--weight 1.0] [--parallel 2] [--append] [--keep DIR] [--name NAME]
    -> benchmarks/results/exactness/study_<critic>.{json,md}

Each run is one ``fastgp train --dataset mnist --critic CRITIC`` in a fresh --out, given the same
budget of ``--budget`` seconds of this machine's CPU time: its row's time per step measured alone
(``benchmarks.exactness.steptime``, the fastest of several repeats) sets its ``--steps`` to
budget / (s / step), so a row that steps faster trains longer, and the load of whatever else
shares the machine does not decide how far a run gets (start-up and compilation are not
counted). The runs' schedules (the learning-rate decay over the last half, r3gan's cosine
weight) span their own steps. ``--parallel`` runs go side by side. Quality is evaluated after each
run: the trainer's own final evaluation (C2ST, Fréchet distance, classes), and along the way the
Fréchet distance of a copy of every checkpoint (``benchmarks.exactness.curve``), placed on the
clock at step x (s / step). The rows (``ROWS``; gamma = 2 x --gp-weight):

    r3gan            relativistic loss, exact R1 + R2, gamma on R3GAN's cosine schedule (x 0.1)
    apt-r1r2         relativistic loss, approximate R1 + R2, APT's lambda = 100 at sigma 0.01
    eps2-r1r2        relativistic loss, approximate R1 + R2 divided by sigma^2 (r3gan's weight)
    stylegan2-lazy   non-saturating loss, exact R1 every 16 critic steps, gain 16, Adam corrected
    apt              non-saturating loss, approximate R1, lambda = 100 at sigma 0.01
    wgan-gp          the Wasserstein loss with WGAN-GP (the mnist recipe)

Each row is declared (``arms``): the ``TrainConfig`` fields it sets; every other field is the base
recipe's for (mnist, critic), the dataset's own and never a recipe taken by name
(``base_fields``). Before any run starts, and again from each run's run.json, the configuration
the run resolves to must equal that declaration, or the study stops with the fields that differ
(``UndeclaredConfig``: field, declared, resolved). Each run's record keeps its resolved
configuration and its commit, and is pooled only with runs of its row declared alike that keep
theirs (``admit``): a results file from before runs recorded them takes no new runs.

A run collapses (``report.collapsed``) when its final samples cover fewer than 8 of the 10
classes, or their Fréchet distance is beyond the calibration's one-class row (all samples one
digit), or it stops on a non-finite value. The C2ST is no criterion here: on MNIST it saturates
by pixel noise of sigma 0.1 (docs/trainer.md).
"""

import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import benchmarks
from benchmarks import harness, records
from benchmarks.exactness import curve, report
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


def steptime_file(critic: str) -> pathlib.Path:
    """The row times ``benchmarks.exactness.steptime`` measured for ``critic``."""
    return RESULTS / f"steptime_{critic}.json"


SIGMA = 0.01  # APT's for images
APT_LAMBDA = 100.0  # APT's lambda: R1 with weight lambda sigma^2 = 0.01
DATASET = "mnist"
BACKEND = "xla"  # the CPU's; every run names it, so that no default decides it


def arms(weight: float) -> dict[str, dict[str, Any]]:
    """Each row's declaration: the ``TrainConfig`` fields it sets, in its flags' order; every
    other field is the base recipe's (``base_fields``). ``weight`` is the relativistic rows' R1
    weight (gamma / 2). R3GAN, StyleGAN2-ADA and APT take one critic step per generator step."""
    relativistic = {"loss": "relativistic", "gp_at": "real+fake", "n_critic": 1}
    non_saturating = {"loss": "non-saturating", "n_critic": 1}
    exact = {"gp_kind": "r1"}
    approximate = {"gp_kind": "approximate-r1", "gp_sigma": SIGMA}
    cosine = {"gp_schedule": "cosine", "gp_weight_final": weight / 10}
    return {
        "r3gan": {**relativistic, **exact, "gp_weight": weight, **cosine},
        "apt-r1r2": {**relativistic, **approximate, "gp_weight": APT_LAMBDA},
        "eps2-r1r2": {**relativistic, **approximate, "approx_scale": "r1", "gp_weight": weight},
        "stylegan2-lazy": {
            **{**non_saturating, **exact, "gp_weight": weight},
            **{"gp_every": 16, "lazy_adam": True},
        },
        "apt": {**non_saturating, **approximate, "gp_weight": APT_LAMBDA},
        "wgan-gp": {"gp_kind": "wgan-gp"},
    }


def rows(weight: float) -> dict[str, list[str]]:
    """Each row's flags (:func:`arms`' fields); ``weight`` is the relativistic rows' R1 weight."""
    return {row: flags_of(fields) for row, fields in arms(weight).items()}


ROWS = tuple(rows(1.0))
SNAPSHOTS = 8  # checkpoints along a run, the points of its Fréchet curve
QUALITY = ("c2st_accuracy", "c2st_sigma", "frechet_distance", "frechet_sigma", "classes_covered")


def run_fields(critic: str, seed: int, steps: int) -> dict[str, Any]:
    """The fields every run sets besides its arm's: critic, seed, length and backend."""
    return {"critic": critic, "seed": seed, "total_steps": steps, "backend": BACKEND}


def run_argv(critic: str, arm: dict[str, Any], seed: int, steps: int) -> list[str]:
    """The ``fastgp train`` flags of one run of ``arm``: dataset, critic, seed, steps, the arm's
    flags, the backend and the cadence (a checkpoint at each of ``SNAPSHOTS``)."""
    every = str(max(steps // SNAPSHOTS, 1))
    argv = ["--dataset", DATASET, "--critic", critic, "--seed", str(seed), "--steps", str(steps)]
    argv += [*flags_of(arm), "--backend", BACKEND, "--log-every", every]
    return [*argv, "--eval-every", str(steps), "--checkpoint-every", every]


def base_fields(critic: str) -> dict[str, Any]:
    """The base recipe of (mnist, ``critic``): the dataset's own, never a recipe taken by name
    (a loss recipe's schedule must not reach an arm that does not declare it)."""
    return dict(recipe(DATASET, critic).fields)


def declared_config(critic: str, arm: dict[str, Any], seed: int, steps: int) -> dict[str, Any]:
    """Every ``TrainConfig`` field of one run as declared: the base recipe's, the run's own
    fields and the arm's, as a run.json records them."""
    fields = {**base_fields(critic), **run_fields(critic, seed, steps), **arm}
    return plain(dataclasses.asdict(TrainConfig(**fields)))


def check_declared(
    what: str, critic: str, arm: dict[str, Any], seed: int, steps: int, run: dict[str, Any]
) -> None:
    """Raise UndeclaredConfig unless ``run`` (a run.json: dataset and config) is the run of
    ``arm`` declared: mnist, and every field the base recipe's, the run's or the arm's."""
    declared = {"dataset": DATASET, **declared_config(critic, arm, seed, steps)}
    found = differences(declared, {"dataset": run.get("dataset"), **run["config"]})
    if found:
        raise UndeclaredConfig(what, found)


def admit(result: dict[str, Any], run: dict[str, Any]) -> None:
    """Refuse (ValueError) to pool ``run`` with the results' earlier runs of its row unless
    they carry their resolved configuration and were declared alike."""
    for earlier in result["runs"]:
        if "config" not in earlier:
            raise ValueError(
                "the results hold runs recorded without their resolved configuration (before "
                "runs recorded it); new runs are not pooled with them: give --name a new file"
            )
        if earlier["row"] == run["row"] and earlier["arm"] != run["arm"]:
            raise ValueError(
                f"{run['row']}: the results' earlier runs of this row were declared "
                f"{earlier['arm']}, this one {run['arm']} (another --weight?); give --name a "
                "new file"
            )


def run_one(
    critic: str,
    row: str,
    arm: dict[str, Any],
    seed: int,
    seconds_per_step: float,
    budget: float,
    keep: Any,
    tag: str,
) -> dict[str, Any]:
    """One run of ``budget / seconds_per_step`` steps: its flags, resolved configuration,
    commit, final quality and its Fréchet distance on the study's clock; UndeclaredConfig
    where what it trained is not ``arm``'s declaration. With ``keep`` its outputs stay in
    ``keep/<tag>-<row>-<seed>``."""
    steps = max(int(budget / seconds_per_step), SNAPSHOTS)
    argv = run_argv(critic, arm, seed, steps)
    what = f"{row}, seed {seed}, {critic} critic"
    run: dict[str, Any] = {"row": row, "critic": critic, "seed": seed, "flags": argv}
    run["arm"] = plain(arm)
    with tempfile.TemporaryDirectory() as scratch:
        out = pathlib.Path(keep) / f"{tag}-{row}-{seed}" if keep else pathlib.Path(scratch)
        fastgp = str(pathlib.Path(sys.executable).with_name("fastgp"))
        command = [fastgp, "train", *argv, "--no-progress", "--out", str(out / "run")]
        env = {**os.environ, "JAX_PLATFORMS": "cpu"}
        proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        curve.Snapshots(out / "run" / "checkpoints", out / "snapshots").follow_until(proc)
        stderr = proc.communicate()[1].decode()[-2000:]
        if not (out / "run" / "run.json").exists():
            raise RuntimeError(f"{what} did not start (exit {proc.returncode}): {stderr}")
        recorded = json.loads((out / "run" / "run.json").read_text())
        check_declared(what, critic, arm, seed, steps, recorded)
        (code,) = recorded["code"]  # one invocation: a fresh --out
        run.update(config=recorded["config"], commit=code["commit"], dirty=code["dirty"])
        if proc.returncode != 0:
            return {**run, "failed": f"exit {proc.returncode}: {stderr}"}
        summary = json.loads((out / "run" / "summary.json").read_text())
        points = curve.frechet_curve(out / "run", out / "snapshots", seconds_per_step)
    run.update(
        steps=summary["steps"],
        s_per_step=seconds_per_step,
        train_s=summary["train_s"],
        curve=points,
        **{k: summary[k] for k in QUALITY},
    )
    return {**run, "collapsed": report.collapsed(run)}


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(__doc__)
    parser.add_argument("--critic", choices=("vit", "conv"), default="vit")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--rows", nargs="+", choices=ROWS, default=list(ROWS))
    parser.add_argument("--budget", type=float, default=300.0, help="CPU seconds a run")
    parser.add_argument("--weight", type=float, default=1.0, help="the R1 weight, gamma / 2")
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--keep", help="keep each run's --out under this folder")
    parser.add_argument("--append", action="store_true")
    parser.add_argument("--name", help="results file name (default study_<critic>)")
    args = parser.parse_args(argv)
    out = RESULTS / (args.name or f"study_{args.critic}")
    invocation = sys.argv[1:] if argv is None else list(argv)
    result = records.runs(out, invocation, args.append)
    del result["commit"]  # each run records its own
    declared = arms(args.weight)
    clock = {
        r["row"]: r["s_per_step"]
        for r in json.loads(steptime_file(args.critic).read_text())["runs"]
    }
    jobs = []
    for seed in args.seeds:
        shift = seed % len(args.rows)
        jobs += [(row, seed) for row in args.rows[shift:] + args.rows[:shift]]
    for row, seed in jobs:  # before any run: each is what its arm declares
        steps = max(int(args.budget / clock[row]), SNAPSHOTS)
        flags = run_argv(args.critic, declared[row], seed, steps)
        admit(result, {"row": row, "arm": plain(declared[row])})
        check_declared(row, args.critic, declared[row], seed, steps, resolved_run(flags))
    page = report.markdown
    with ThreadPoolExecutor(args.parallel) as pool:
        futures = [
            pool.submit(
                run_one,
                args.critic,
                row,
                declared[row],
                seed,
                clock[row],
                args.budget,
                args.keep,
                out.name,
            )
            for row, seed in jobs
        ]
        for future in futures:
            run = {**future.result(), "budget_s": args.budget}
            admit(result, run)
            records.add_run(out, result, run, page)
            report.figure(result, out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
