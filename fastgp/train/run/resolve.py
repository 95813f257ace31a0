"""Which run an invocation of ``fastgp train`` is: a fresh recipe, or the checkpoint's run.

    dataset, config, resumed = resolve(options, overrides, checkpoints, primary=True)
    dataset, config = fresh(options, overrides)     # what a fresh run with these flags trains

``overrides`` maps TrainConfig fields to values given on the command line; the rest come from
``fastgp.train.recipes.defaults`` (fresh run, ``resumed`` None: the dataset's recipe, or the one
``--recipe`` names) or from the newest intact checkpoint in --out (``options.resume``; a flag that
contradicts it is a RunError naming the flag, but :data:`CHANGEABLE_ON_RESUME` fields may
change). Damaged newer checkpoints are reported and (process 0) moved to ``out/DAMAGED``. Every
error is a ``RunError`` naming the flags it comes from (:data:`FLAGS`).
"""

import dataclasses
import json
from pathlib import Path
from typing import Any

import jax

from fastgp.train.config import FLAGS, ConfigError, TrainConfig
from fastgp.train.recipes.defaults import build_problem, default_config, recipe_hint
from fastgp.train.run.checkpoints import CheckpointDamaged, Checkpoints, reason
from fastgp.train.run.options import DEFAULT_DATASET, RunError, RunOptions, warn
from fastgp.train.trainers.state import init_state

DAMAGED = "checkpoints-damaged"  # where --resume moves damaged checkpoints, inside --out
# Fields a resumed run may change: they do not alter what is computed, only how.
CHANGEABLE_ON_RESUME = ("backend",)
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrainConfig)}


def default_backend() -> str:
    """ "xla" on CPU (the kernel's interpret modes are for checks), else "auto" (today XLA too:
    docs/performance.md has the compiled figures behind it; ``pallas`` forces the kernel)."""
    return "xla" if jax.default_backend() == "cpu" else "auto"


def _flag_error(err: ConfigError, overrides: dict[str, Any]) -> RunError:
    """A TrainConfig error as a RunError naming the flags (with their values) it comes from."""
    given = [f"{FLAGS[f]} {overrides[f]}" for f in err.fields if f in FLAGS and f in overrides]
    named = given or [FLAGS.get(f, f) for f in err.fields]
    return RunError(f"{' with '.join(dict.fromkeys(named))}: {err}")


def _stored_run(step: int, meta: dict[str, Any]) -> tuple[str, TrainConfig]:
    """(dataset, TrainConfig) recorded in a checkpoint's metadata."""
    try:
        config = dict(meta["config"], betas=tuple(meta["config"]["betas"]))
        return meta["dataset"], TrainConfig(**config)
    except (KeyError, TypeError, ValueError) as err:
        raise CheckpointDamaged(step, f"its metadata holds no valid run config ({err})") from None


@dataclasses.dataclass
class Resumed:
    """The checkpoint a run continues from: its step, metadata and state (host numpy)."""

    step: int
    meta: dict[str, Any]
    state: Any


def _newest_intact(checkpoints: Checkpoints, out: Path, primary: bool) -> Resumed:
    """The newest checkpoint that verifies and restores. Damaged newer ones are reported and
    (process 0) moved to ``out/DAMAGED``, so that this run can write those steps again."""
    damaged, templates = [], {}
    for step in reversed(checkpoints.steps()):
        try:
            checkpoints.verify(step)
            meta = checkpoints.meta(step)
            dataset, config = _stored_run(step, meta)
            key = json.dumps([dataset, dataclasses.asdict(config)], sort_keys=True)
            if key not in templates:
                problem = build_problem(dataset, config)
                templates[key] = init_state(config, problem.generator, problem.critic)
            state = checkpoints.state(step, templates[key])
        except CheckpointDamaged as err:
            damaged.append(err)
            continue
        break
    else:
        raise RunError(
            f"--resume: every checkpoint in {checkpoints.directory} is damaged ("
            + "; ".join(f"{e.step}: {e.reason}" for e in damaged)
            + ")"
        )
    if damaged:
        _quarantine(checkpoints, damaged, out, step, primary)
    return Resumed(step, meta, state)


def _quarantine(
    checkpoints: Checkpoints,
    damaged: list[CheckpointDamaged],
    out: Path,
    step: int,
    primary: bool,
) -> None:
    """Move the ``damaged`` checkpoints to ``out/DAMAGED`` (process 0, saying so; every process
    waits for it) and reload ``checkpoints``; ``step`` is the intact one resumed from."""
    _barrier("fastgp-resume-select")
    if primary:
        for damage in damaged:
            try:
                moved = checkpoints.quarantine(damage.step, out / DAMAGED)
            except OSError as move_err:
                raise RunError(
                    f"--resume: {damage}, and it cannot be moved to "
                    f"{out / DAMAGED} ({reason(move_err)})"
                ) from None
            warn(f"{damage}; moved it to {moved}")
        warn(f"resuming from checkpoint {step}, the newest intact one")
    _barrier("fastgp-resume-moved")
    checkpoints.reload()


def _barrier(name: str) -> None:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def resolve(
    options: RunOptions,
    overrides: dict[str, Any],
    checkpoints: Checkpoints,
    *,
    primary: bool = True,
) -> tuple[str, TrainConfig, Resumed | None]:
    """(dataset, TrainConfig, Resumed or None): a fresh run's recipe, or the checkpoint's run."""
    out = Path(options.out)
    steps = checkpoints.steps()
    if steps and not options.resume:
        raise RunError(
            f"--out {out} already holds checkpoints (latest step {steps[-1]}); "
            f"pass --resume to continue that run or choose another --out"
        )
    if not steps:
        if options.resume:
            raise RunError(
                f"--resume: there is no checkpoint in {checkpoints.directory} to "
                f"continue from; check --out, or drop --resume to start a new run"
            )
        dataset, config = fresh(options, overrides)
        hint = options.recipe is None and "loss" in overrides
        if primary and hint and (line := recipe_hint(dataset, config.critic, config.loss)):
            warn(line)
        return dataset, config, None
    return _continued(options, overrides, _newest_intact(checkpoints, out, primary))


def fresh(options: RunOptions, overrides: dict[str, Any]) -> tuple[str, TrainConfig]:
    """(dataset, TrainConfig) of a new run: the dataset's recipe, or the one ``--recipe`` names,
    with each flag's field (``default_backend`` unless --backend)."""
    dataset = options.dataset or DEFAULT_DATASET
    overrides = {"backend": default_backend(), **overrides}
    try:
        return dataset, default_config(dataset, options.recipe, **overrides)
    except ConfigError as err:
        raise _flag_error(err, overrides) from None
    except ValueError as err:
        raise RunError(str(err)) from None


def _continued(
    options: RunOptions, overrides: dict[str, Any], resumed: Resumed
) -> tuple[str, TrainConfig, Resumed]:
    """The checkpoint's run; a flag that contradicts it is a RunError, except the fields of
    ``CHANGEABLE_ON_RESUME``, which the flags override."""
    meta = resumed.meta
    if options.dataset not in (None, meta["dataset"]):
        raise RunError(
            f"--dataset {options.dataset} contradicts the checkpoint in "
            f"{options.out} (dataset {meta['dataset']}); drop --dataset or choose "
            f"another --out"
        )
    if options.recipe not in (None, meta.get("recipe")):
        stored = meta.get("recipe") or "the dataset's own"
        raise RunError(
            f"--recipe {options.recipe} contradicts the checkpoint in {options.out} (recipe "
            f"{stored}); drop --recipe to resume"
        )
    # A field an older checkpoint does not record (critic) has the value it trained with: the
    # default.
    stored = {**_DEFAULTS, **meta["config"], "betas": tuple(meta["config"]["betas"])}
    if overrides.get("second_order") == "auto":  # the checkpoint holds the order it picked
        overrides = dict(overrides, second_order=None)
    for field, value in overrides.items():
        if value is not None and value != stored[field] and field not in CHANGEABLE_ON_RESUME:
            raise RunError(
                f"{FLAGS.get(field, field)} {value} contradicts the checkpoint in "
                f"{options.out} ({field}={stored[field]}); drop the flag to resume"
            )
    stored.update({k: v for k, v in overrides.items() if k in CHANGEABLE_ON_RESUME and v})
    try:
        return meta["dataset"], TrainConfig(**stored), resumed
    except ConfigError as err:
        raise _flag_error(err, overrides) from None


__all__ = [
    "CHANGEABLE_ON_RESUME",
    "DAMAGED",
    "Resumed",
    "default_backend",
    "fresh",
    "resolve",
]
