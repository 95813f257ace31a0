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

A run collapses (``report.collapsed``) when its final samples cover fewer than 8 of the 10
classes, or their Fréchet distance is beyond the calibration's one-class row (all samples one
digit), or it stops on a non-finite value. The C2ST is no criterion here: on MNIST it saturates
by pixel noise of sigma 0.1 (docs/trainer.md).
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import benchmarks
from benchmarks import records
from benchmarks.exactness import curve, report

RESULTS = benchmarks.RESULTS / "exactness"


def steptime_file(critic: str) -> pathlib.Path:
    """The row times ``benchmarks.exactness.steptime`` measured for ``critic``."""
    return RESULTS / f"steptime_{critic}.json"


SIGMA = 0.01  # APT's for images
APT_LAMBDA = 100.0  # APT's lambda: R1 with weight lambda sigma^2 = 0.01
EXACT = ["--gp-kind", "r1"]
APPROXIMATE = ["--gp-kind", "approximate-r1", "--gp-sigma", f"{SIGMA:g}"]
# R3GAN, StyleGAN2-ADA and APT take one critic step per generator step.
RELATIVISTIC = ["--loss", "relativistic", "--gp-at", "real+fake", "--n-critic", "1"]
NON_SATURATING = ["--loss", "non-saturating", "--n-critic", "1"]


def rows(weight: float) -> dict[str, list[str]]:
    """Each row's flags; ``weight`` is the relativistic rows' R1 weight (gamma / 2)."""
    cosine = ["--gp-schedule", "cosine", "--gp-weight-final", f"{weight / 10:g}"]
    return {
        "r3gan": [*RELATIVISTIC, *EXACT, "--gp-weight", f"{weight:g}", *cosine],
        "apt-r1r2": [*RELATIVISTIC, *APPROXIMATE, "--gp-weight", f"{APT_LAMBDA:g}"],
        "eps2-r1r2": [
            *RELATIVISTIC,
            *APPROXIMATE,
            *("--approx-scale", "r1", "--gp-weight", f"{weight:g}"),
        ],
        "stylegan2-lazy": [
            *(*NON_SATURATING, *EXACT, "--gp-weight", f"{weight:g}"),
            *("--gp-every", "16", "--lazy-adam"),
        ],
        "apt": [*NON_SATURATING, *APPROXIMATE, "--gp-weight", f"{APT_LAMBDA:g}"],
        "wgan-gp": ["--gp-kind", "wgan-gp"],
    }


ROWS = tuple(rows(1.0))
SNAPSHOTS = 8  # checkpoints along a run, the points of its Fréchet curve
QUALITY = ("c2st_accuracy", "c2st_sigma", "frechet_distance", "frechet_sigma", "classes_covered")


def run_one(
    critic: str,
    row: str,
    flags: list[str],
    seed: int,
    seconds_per_step: float,
    budget: float,
    keep: Any,
    tag: str,
) -> dict[str, Any]:
    """One run of ``budget / seconds_per_step`` steps: its flags, final quality and its Fréchet
    distance on the study's clock; with ``keep`` its outputs stay in
    ``keep/<tag>-<row>-<seed>``."""
    steps = max(int(budget / seconds_per_step), SNAPSHOTS)
    argv = ["--dataset", "mnist", "--critic", critic, "--seed", str(seed), "--steps", str(steps)]
    argv += [*flags, "--log-every", str(max(steps // SNAPSHOTS, 1)), "--eval-every", str(steps)]
    argv += ["--checkpoint-every", str(max(steps // SNAPSHOTS, 1))]
    run: dict[str, Any] = {"row": row, "critic": critic, "seed": seed, "flags": argv}
    with tempfile.TemporaryDirectory() as scratch:
        out = pathlib.Path(keep) / f"{tag}-{row}-{seed}" if keep else pathlib.Path(scratch)
        fastgp = str(pathlib.Path(sys.executable).with_name("fastgp"))
        command = [fastgp, "train", *argv, "--no-progress", "--out", str(out / "run")]
        env = {**os.environ, "JAX_PLATFORMS": "cpu"}
        proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        curve.Snapshots(out / "run" / "checkpoints", out / "snapshots").follow_until(proc)
        stderr = proc.communicate()[1].decode()[-2000:]
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
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
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
    flags = rows(args.weight)
    clock = {
        r["row"]: r["s_per_step"]
        for r in json.loads(steptime_file(args.critic).read_text())["runs"]
    }
    jobs = []
    for seed in args.seeds:
        shift = seed % len(args.rows)
        jobs += [(row, seed) for row in args.rows[shift:] + args.rows[:shift]]
    page = report.markdown
    with ThreadPoolExecutor(args.parallel) as pool:
        futures = [
            pool.submit(
                run_one,
                args.critic,
                row,
                flags[row],
                seed,
                clock[row],
                args.budget,
                args.keep,
                out.name,
            )
            for row, seed in jobs
        ]
        for future in futures:
            records.add_run(out, result, {**future.result(), "budget_s": args.budget}, page)
            report.figure(result, out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
