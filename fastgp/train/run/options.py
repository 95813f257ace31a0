"""What one ``fastgp train`` invocation is given, and how it fails or speaks.

    RunOptions(dataset=None, out=Path("runs/8gaussians"), ...)   per-invocation settings
    RunError      a bad flag or output directory (checked before training starts)
    RunFailure    the run cannot go on: a checkpoint or output cannot be written, or it diverged
    write_output(what, writer, *args)   the writer's result; an OSError becomes a RunFailure
    warn(text)    one "fastgp train: text" line on stderr

``CADENCE`` holds the defaults of how often a run logs, checkpoints and evaluates (a resumed run
keeps its checkpoint's values); ``fastgp.train.run.loop`` uses all of these.
"""

import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from fastgp.train.run.checkpoints import reason

T = TypeVar("T")
DEFAULT_DATASET = "8gaussians"
# Defaults of the per-invocation cadence (a resumed run keeps its checkpoint's values).
CADENCE = {"log_every": 100, "checkpoint_every": 1000, "eval_every": 500, "eval_samples": 2500}


class RunError(ValueError):
    """A problem with the run's flags or output directory (message names the flag)."""


class RunFailure(RuntimeError):
    """The run cannot go on: a checkpoint or output cannot be written, or training diverged."""


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """Per-invocation settings (not part of the checkpointed config)."""

    dataset: str | None = None  # None: the default, or the checkpoint's when resuming
    # A recipe taken by name (``fastgp.train.recipes.defaults.NAMED_RECIPES``); None: the
    # dataset's own, or the checkpoint's when resuming
    recipe: str | None = None
    out: Path | str = Path("runs") / DEFAULT_DATASET
    # None: the checkpoint's value when resuming, else CADENCE's
    log_every: int | None = None
    checkpoint_every: int | None = None
    eval_every: int | None = None
    eval_samples: int | None = None
    stop_at: int | None = None  # end this invocation at this iteration (checkpointed)
    resume: bool = False
    progress: bool = True
    devices: int | None = None  # mesh size (default: every visible device)
    # Trainer.run as one fused scan (True) or an iteration per dispatch (False); None: the
    # trainer's choice by platform and networks (``fastgp.train.trainers.fusion.default_fused``).
    # The same steps and random numbers either way, equal up to float rounding: not checkpointed,
    # a resumed run may choose differently (bitwise equal to an uninterrupted run with the same).
    fused: bool | None = None


def write_output(what: str, fn: Callable[..., T], *args: Any) -> T:
    """Run an output writer; an OSError (disk full, read-only, ...) becomes a RunFailure."""
    try:
        return fn(*args)
    except OSError as err:
        raise RunFailure(f"cannot write {what} ({reason(err)})") from None


def warn(text: str) -> None:
    """Print ``fastgp train: text`` on stderr."""
    print(f"fastgp train: {text}", file=sys.stderr, flush=True)


__all__ = [
    "CADENCE",
    "DEFAULT_DATASET",
    "RunError",
    "RunFailure",
    "RunOptions",
    "warn",
    "write_output",
]
