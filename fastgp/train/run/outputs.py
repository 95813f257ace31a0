"""What a training run leaves in its output directory (written by process 0 only).

    metrics.jsonl    one JSON object per logged step (see :func:`metrics_record`)
    samples.npy      generator samples in data coordinates at the end, (N, ...) float32
    figure.png       see ``fastgp.train.run.figures``
    summary.json     the final summary line
    run.json         the dataset, the recipe taken by name, every TrainConfig field, the
                     cadence and each invocation's code (``fastgp.train.run.session``)
    checkpoints/     orbax checkpoints (``fastgp.train.run.checkpoints``)
    checkpoints-damaged/   damaged checkpoints that ``--resume`` skipped
    .fastgp.lock     exists while a run uses the directory (``fastgp.train.run.lock``)

Every JSON file is strict JSON: a non-finite float (a diverged loss) is written as null.

    source_commit() -> {"commit": "<40 hex digits>" or "unknown", "dirty": bool or None}

is the code a run trains with, for run.json: ``git rev-parse HEAD`` of the checkout that holds
fastgp, and whether its tracked files differ from that commit (``git status --porcelain
--untracked-files=no``). Outside a checkout of fastgp (an installed wheel, a copy, a package
inside some other repository that does not track it) or without git: "unknown" and None.
"""

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np

import fastgp

METRICS = "metrics.jsonl"
SAMPLES = "samples.npy"
FIGURE = "figure.png"
SUMMARY = "summary.json"
RUN = "run.json"
CHECKPOINTS = "checkpoints"
UNKNOWN = "unknown"  # the commit of code outside a git checkout of fastgp
GIT_TIMEOUT_S = 10.0


def metrics_record(
    step: int, wall_s: float, metrics: dict[str, Any], quality: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One log line from the ``Trainer.run`` metrics of the chunk that ended at ``step``.

    Losses are the last critic / generator step's (core 0; every core holds the same global
    value). ``norm_mean/min/max`` are per core (lists of N) at the last critic step that applied
    the penalty (null when none did); ``nonfinite`` counts each core's non-finite norms over the
    whole chunk. ``quality``: modes, total_modes, high_quality (2-D mixtures); c2st_accuracy,
    c2st_floor, c2st_sigma, frechet_distance, frechet_spread, frechet_sigma, confidence,
    classes_covered, class_entropy (digits: ``fastgp.train.run.evaluation.DIGITS_RECORD``).
    """
    m = {name: np.asarray(value) for name, value in metrics.items()}
    critic = lambda name: m[name].reshape((-1,) + m[name].shape[2:])  # (I*C, N)
    applied = np.flatnonzero(m["gp_applied"].reshape(-1))
    last_gp = int(applied[-1]) if applied.size else None
    record: dict[str, Any] = {
        "step": int(step),
        "wall_s": round(float(wall_s), 3),
        "critic_loss": float(critic("critic_loss")[-1, 0]),
        "penalty": float(critic("penalty")[last_gp if last_gp is not None else -1, 0]),
        "wasserstein": float(critic("wasserstein")[-1, 0]),
        "generator_loss": float(m["generator_loss"][-1, 0]),
    }
    for name in ("norm_mean", "norm_min", "norm_max"):
        record[name] = (
            None if last_gp is None else [_finite_or_none(v) for v in critic(name)[last_gp]]
        )
    record["nonfinite"] = [int(v) for v in critic("nonfinite").sum(0)]
    if quality is not None:
        record.update(quality)
    return record


def _finite_or_none(v: Any) -> float | None:
    v = float(v)
    return v if np.isfinite(v) else None


def strict(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (JSON null), recursively."""
    if isinstance(value, (float, np.floating)):
        return float(value) if np.isfinite(value) else None
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """Strict JSON text of ``value`` (non-finite floats as null)."""
    return json.dumps(strict(value), allow_nan=False, **kwargs)


class MetricsLog:
    """Appends records to ``metrics.jsonl``; on resume drops lines past the checkpoint's step."""

    def __init__(self, out: Path, *, keep_until: int | None = None) -> None:
        self.path = Path(out) / METRICS
        self.records = []
        if keep_until is not None and self.path.exists():
            self.records = [r for r in read_metrics(self.path) if r["step"] <= keep_until]
        self.path.write_text("".join(dumps(r) + "\n" for r in self.records))

    def append(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        with self.path.open("a") as f:
            f.write(dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())


def read_metrics(path: Path | str) -> list[dict[str, Any]]:
    """All complete records of a metrics.jsonl (a torn last line is skipped)."""
    records = []
    for line in Path(path).read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return records


def out_problem(out: Path | str, resume: bool = False) -> str | None:
    """Why ``out`` cannot be a run's output directory (text naming the path), or None."""
    out = Path(out)
    if out.exists():
        if not out.is_dir():
            return f"{out} is a file, not a directory"
        if not os.access(out, os.W_OK | os.X_OK):
            return f"{out} is not writable"
        return None
    if resume:
        return (
            f"{out} does not exist, so there is no run to --resume; check the path, or drop "
            f"--resume to start a new run"
        )
    parent = out.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return f"{out} cannot be created: {parent} is a file"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"{out} cannot be created: {parent} is not writable"
    return None


def write_json(path: Path | str, value: Any) -> None:
    Path(path).write_text(dumps(value, indent=1) + "\n")


def _git(directory: Path, *args: str) -> str | None:
    """git's stdout in ``directory`` (stripped), or None when git fails or cannot run."""
    try:
        done = subprocess.run(
            ["git", *args], cwd=directory, capture_output=True, text=True, timeout=GIT_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def source_commit(package: Path | None = None) -> dict[str, Any]:
    """The commit and dirtiness of the git checkout that tracks ``package`` (default: fastgp's
    own directory); "unknown" and None where no checkout tracks it."""
    package = Path(package or Path(fastgp.__file__).parent).resolve()
    # A package inside some other repository (a virtualenv in a project) is not tracked there:
    # only a checkout that tracks the package's own __init__.py is its source.
    if _git(package, "ls-files", "--error-unmatch", "__init__.py") is None:
        return {"commit": UNKNOWN, "dirty": None}
    commit = _git(package, "rev-parse", "HEAD")
    status = _git(package, "status", "--porcelain", "--untracked-files=no")
    if commit is None or status is None:
        return {"commit": UNKNOWN, "dirty": None}
    return {"commit": commit, "dirty": bool(status)}


def write_samples(out: Path, samples: np.ndarray) -> Path:
    path = Path(out) / SAMPLES
    np.save(path, np.asarray(samples, np.float32))
    return path


__all__ = [
    "CHECKPOINTS",
    "FIGURE",
    "METRICS",
    "MetricsLog",
    "RUN",
    "SAMPLES",
    "SUMMARY",
    "UNKNOWN",
    "dumps",
    "metrics_record",
    "out_problem",
    "read_metrics",
    "source_commit",
    "strict",
    "write_json",
    "write_samples",
]
