"""Multi-process cost on one machine: 2 processes x 2 devices against 1 process x 4 devices.

    JAX_PLATFORMS=cpu python -m benchmarks.training.multihost_ratio [--steps 300] [--repeats 2]
    -> benchmarks/results/training/multihost.md

Both run the same toy WGAN-GP (``fastgp train``, 8 Gaussians, the given steps) on 4 devices in
all; the figure is ``train_s`` from each run's summary.json (training only, compilation
included, start-up excluded), the two layouts interleaved so machine load hits both alike.
"""

import json
import os
import pathlib
import subprocess
import sys
import tempfile

import benchmarks
from benchmarks import harness
from benchmarks.tables import markdown_table

LAYOUTS = {
    "1 process x 4 devices": ["--devices", "4"],
    "2 processes x 2 devices": ["--processes", "2", "--devices", "2"],
}


def train_seconds(flags, steps: int) -> float:
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            sys.executable,
            "-m",
            "fastgp.train.cli",
            "train",
            "--steps",
            str(steps),
            "--out",
            out,
            "--no-progress",
            *flags,
        ]
        env = {**os.environ, "JAX_PLATFORMS": "cpu"}
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
        return json.loads((pathlib.Path(out) / "summary.json").read_text())["train_s"]


def main(argv=None) -> int:
    parser = harness.parser(__doc__)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    times = {name: [] for name in LAYOUTS}
    for _ in range(args.repeats):
        for name, flags in LAYOUTS.items():
            times[name].append(train_seconds(flags, args.steps))
            print(name, times[name][-1], flush=True)
    one, two = (min(times[name]) for name in LAYOUTS)
    lines = [
        "# Multi-process cost on one machine",
        "",
        (
            f"`python -m benchmarks.training.multihost_ratio --steps {args.steps} --repeats "
            f"{args.repeats}`: `fastgp train` on 8 Gaussians, {args.steps} generator steps, "
            "train_s from summary.json (best of the interleaved repeats)."
        ),
        "",
    ]
    lines += markdown_table(
        ["layout", "train_s (each repeat)", "best"],
        [[name, ", ".join(f"{t:.1f}" for t in ts), f"{min(ts):.1f}"] for name, ts in times.items()],
    )
    lines += ["", f"Ratio 2x2 / 1x4: **{two / one:.2f}x**."]
    out = benchmarks.RESULTS / "training"
    out.mkdir(parents=True, exist_ok=True)
    (out / "multihost.md").write_text("\n".join(lines) + "\n")
    print(lines[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
