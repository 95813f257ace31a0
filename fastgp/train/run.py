"""One ``fastgp train`` run: the chunked training loop, evaluation, logs, checkpoints, outputs.

    summary = train(RunOptions(dataset=None, out=Path("runs/8gaussians")), overrides={})

``overrides`` maps TrainConfig fields to values given on the command line; the rest come from
``fastgp.train.recipes`` (fresh run) or from the checkpoint (``resume``; a flag that contradicts the
checkpoint is an error naming it). Training runs in chunks of ``Trainer.run`` that end on
multiples of ``log_every``, ``eval_every`` and ``checkpoint_every``; each chunk end is one line of
metrics.jsonl. Random numbers depend only on (seed, iteration), so a run continued from a
checkpoint reaches the same parameters as one that never stopped. Every process runs this loop;
process 0 alone logs, evaluates and writes outputs (checkpoints are written collectively).

Faults end a run with one message: flags and the output directory raise :class:`RunError`
(checked before training starts); a checkpoint or output that cannot be written and non-finite
losses or parameters raise :class:`RunFailure` (the newest checkpoint on disk stays the last
finite one). Process 0 holds ``fastgp.train.runlock`` on --out for the whole run. ``--resume``
continues from the newest intact checkpoint: damaged newer ones are reported and moved to
``checkpoints-damaged/``. With a ``fastgp.train.signals.StopRequest`` a signal ends the run at the
next chunk end, after a checkpoint and the outputs (the summary then says ``stopped_by``).
"""

import dataclasses
import json
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import jax
import numpy as np

from fastgp.train import outputs
from fastgp.train.checkpoints import (
    CheckpointDamaged,
    Checkpoints,
    CheckpointWriteError,
    host_copy,
    reason,
)
from fastgp.train.evaluation import Evaluator
from fastgp.train.nonfinite import first_nonfinite_loss, nonfinite_state
from fastgp.train.penalty_tuning import choose_second_order, tuning_line, tuning_record
from fastgp.train.progress import RunProgress
from fastgp.train.recipes import build_problem, default_config
from fastgp.train.runlock import DirectoryBusy, RunLock
from fastgp.train.signals import StopRequest
from fastgp.train.state import ConfigError, TrainConfig, TrainState, init_state
from fastgp.train.trainer import Trainer, make_mesh

T = TypeVar("T")
DEFAULT_DATASET = "8gaussians"
DAMAGED = "checkpoints-damaged"  # where --resume moves damaged checkpoints, inside --out
# TrainConfig field -> the command-line flag that sets it (for error messages).
FLAGS = {
    "total_steps": "--steps",
    "batch_size": "--batch-size",
    "backend": "--backend",
    "precision": "--precision",
    "gp_every": "--gp-every",
    "gp_kind": "--gp-kind",
    "second_order": "--second-order",
    "gp_weight": "--gp-weight",
    "gp_sigma": "--gp-sigma",
    "seed": "--seed",
    "n_critic": "--n-critic",
    "lr_g": "--lr",
    "lr_d": "--lr",
    "decay_fraction": "--decay-fraction",
}
# Fields a resumed run may change: they do not alter what is computed, only how.
CHANGEABLE_ON_RESUME = ("backend",)


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
    # trainer's choice by platform and networks (``fastgp.train.trainer.default_fused``).
    # The same steps and random numbers either way, equal up to float rounding: not checkpointed,
    # a resumed run may choose differently (bitwise equal to an uninterrupted run with the same).
    fused: bool | None = None


def default_backend() -> str:
    """ "xla" on CPU (the kernel's interpret modes are for checks), else "auto" (today XLA too:
    docs/performance.md has the compiled figures behind it; ``pallas`` forces the kernel)."""
    return "xla" if jax.default_backend() == "cpu" else "auto"


def _cadence(options: RunOptions, stored: dict[str, Any]) -> RunOptions:
    """``options`` with unset cadence fields taken from ``stored``, else from CADENCE."""
    return dataclasses.replace(
        options,
        **{k: getattr(options, k) or stored.get(k, default) for k, default in CADENCE.items()},
    )


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
                _warn(f"{damage}; moved it to {moved}")
            _warn(f"resuming from checkpoint {step}, the newest intact one")
        _barrier("fastgp-resume-moved")
        checkpoints.reload()
    return Resumed(step, meta, state)


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
        dataset = options.dataset or DEFAULT_DATASET
        overrides = {"backend": default_backend(), **overrides}
        try:
            return dataset, default_config(dataset, **overrides), None
        except ConfigError as err:
            raise _flag_error(err, overrides) from None
        except ValueError as err:
            raise RunError(str(err)) from None
    resumed = _newest_intact(checkpoints, out, primary)
    meta = resumed.meta
    if options.dataset not in (None, meta["dataset"]):
        raise RunError(
            f"--dataset {options.dataset} contradicts the checkpoint in "
            f"{options.out} (dataset {meta['dataset']}); drop --dataset or choose "
            f"another --out"
        )
    stored = dict(meta["config"], betas=tuple(meta["config"]["betas"]))
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


def _warn(text: str) -> None:
    print(f"fastgp train: {text}", file=sys.stderr, flush=True)


def _barrier(name: str) -> None:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def _stop_signal(stop: StopRequest | None) -> int:
    """The signal number a stop was requested with on any process (0: none)."""
    signum = (stop.signum or 0) if stop is not None else 0
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        signum = int(np.max(multihost_utils.process_allgather(np.int32(signum))))
    return signum


def _prepare_out(out: Path, resume: bool) -> RunLock:
    """Create --out (process 0) and lock it for this run; RunError naming --out."""
    problem = outputs.out_problem(out, resume)
    if problem:
        raise RunError(f"--out {problem}")
    try:
        out.mkdir(parents=True, exist_ok=True)
        return RunLock.acquire(out)
    except DirectoryBusy as err:
        raise RunError(f"--out {err}; wait for it to end or choose another --out") from None
    except OSError as err:
        raise RunError(
            f"--out {out} cannot be written ({reason(err)}); choose another --out"
        ) from None


def _write(what: str, fn: Callable[..., T], *args: Any) -> T:
    """Run an output writer; an OSError (disk full, read-only, ...) becomes a RunFailure."""
    try:
        return fn(*args)
    except OSError as err:
        raise RunFailure(f"cannot write {what} ({reason(err)})") from None


def _devices_error(
    config: TrainConfig,
    n: int,
    options: RunOptions,
    overrides: dict[str, Any],
    resumed: Resumed | None,
) -> RunError:
    b = config.batch_size
    if "batch_size" in overrides:
        return RunError(
            f"--batch-size {b} is not divisible by the {n} devices; use a multiple of {n}"
        )
    source = "the checkpoint's" if resumed is not None else "the recipe's"
    divisors = [d for d in range(1, min(b, 64) + 1) if b % d == 0]
    if options.devices:
        given = f"--devices {n}" if jax.process_count() == 1 else f"--devices x --processes = {n}"
        return RunError(
            f"{given}: the run's batch size {b} ({source}) is not divisible by {n} "
            f"devices; use a device count in {divisors}"
        )
    return RunError(
        f"the run's batch size {b} ({source}) is not divisible by the {n} visible "
        f"devices; pass --devices with one of {divisors}"
    )


def _next_stop(it: int, end: int, *periods: int | None) -> int:
    return min([end] + [(it // p + 1) * p for p in periods if p])


def train(
    options: RunOptions, overrides: dict[str, Any], stop: StopRequest | None = None
) -> dict[str, Any]:
    """Run (or continue) training; returns the summary (process 0 also writes it to --out).

    ``stop``: a ``fastgp.train.signals.StopRequest`` whose signal ends the run at the next chunk
    end (every process stops at the same step). Raises RunError or RunFailure."""
    out = Path(options.out)
    lock = _prepare_out(out, options.resume) if jax.process_index() == 0 else None
    if lock is not None and stop is not None:
        stop.on_exit.append(lock.release)
    try:
        return _train(options, overrides, stop)
    finally:
        if lock is not None:
            lock.release()


def _train(
    options: RunOptions, overrides: dict[str, Any], stop: StopRequest | None
) -> dict[str, Any]:
    session = _setup(options, overrides)
    it, signum = _loop(session, stop)
    return _finish(session, it, signum)


class _Cadence(NamedTuple):
    """The cadence of this invocation, every field of ``CADENCE`` resolved."""

    log_every: int
    checkpoint_every: int
    eval_every: int
    eval_samples: int


@dataclasses.dataclass
class _Session:
    """One invocation's run, from :func:`_setup` through :func:`_loop` to :func:`_finish`."""

    options: RunOptions
    cadence: _Cadence
    out: Path
    primary: bool
    dataset: str
    config: TrainConfig
    checkpoints: Checkpoints
    trainer: Trainer
    state: TrainState
    evaluator: Evaluator
    log: outputs.MetricsLog | None
    run_meta: dict[str, Any]
    devices: int
    total: int  # the run's generator iterations
    end: int  # the iteration this invocation stops at
    start: float  # time.perf_counter() at the start of this invocation
    wall_before: float  # the wall seconds of the invocations before (a resumed run)

    def wall(self) -> float:
        return self.wall_before + time.perf_counter() - self.start

    def save(self, step: int) -> None:
        try:
            self.checkpoints.save(step, self.state, {**self.run_meta, "wall_s": self.wall()})
        except CheckpointWriteError as err:
            newest = self.checkpoints.latest_step()
            raise RunFailure(
                f"{err}. The run stopped at step {step}; "
                + (
                    f"its newest checkpoint is step {newest} (--resume continues from it)"
                    if newest is not None
                    else "it has no checkpoint yet"
                )
            ) from None


def _setup(options: RunOptions, overrides: dict[str, Any]) -> _Session:
    """The config, the trainer and its state (fresh or resumed), the evaluator, metrics.jsonl
    and run.json: everything before the first step."""
    start = time.perf_counter()
    out = Path(options.out)
    primary = jax.process_index() == 0
    try:
        checkpoints = Checkpoints(out / outputs.CHECKPOINTS)
    except OSError as err:
        raise RunError(
            f"--out {out}: cannot use {out / outputs.CHECKPOINTS} ({reason(err)})"
        ) from None
    dataset, config, resumed = resolve(options, overrides, checkpoints, primary=primary)
    options = _cadence(options, {} if resumed is None else resumed.meta.get("cadence", {}))
    cadence = _Cadence(*(int(getattr(options, k)) for k in CADENCE))
    total = config.total_steps
    assert total is not None  # resolve() sets it
    end = min(total, options.stop_at) if options.stop_at else total
    wall_before = 0.0 if resumed is None else float(resumed.meta.get("wall_s", 0.0))

    problem = build_problem(dataset, config)
    devices = jax.devices()
    if options.devices:
        devices = devices[: options.devices]
    if config.batch_size % len(devices):
        raise _devices_error(config, len(devices), options, overrides, resumed)
    tuned = None
    if config.second_order == "auto":
        config, tuned = choose_second_order(config, problem, config.batch_size // len(devices))
        if primary:
            _warn(tuning_line(config, tuned))
    try:
        trainer = Trainer(
            config,
            problem.generator,
            problem.critic,
            problem.sample_real,
            mesh=make_mesh(devices),
            fused=options.fused,
        )
    except ValueError as err:
        raise RunError(
            f"--backend {config.backend}: {err}" if "backend" in str(err) else str(err)
        ) from None
    state = trainer.init()
    if resumed is not None:
        state = trainer.replicate(resumed.state)
    it = int(host_copy(state.iteration))
    log = (
        _write(f"{out / outputs.METRICS}", lambda: outputs.MetricsLog(out, keep_until=it))
        if primary
        else None
    )
    run_meta = {
        "dataset": dataset,
        "config": dataclasses.asdict(config),
        "cadence": {k: getattr(options, k) for k in CADENCE},
    }
    if primary:
        _write(
            f"{out / outputs.RUN}",
            outputs.write_json,
            out / outputs.RUN,
            {
                **run_meta,
                "devices": len(devices),
                "processes": jax.process_count(),
                "fused": trainer.fused,
                **({} if tuned is None else {"second_order_tuning": tuning_record(tuned)}),
            },
        )
    return _Session(
        options=options,
        cadence=cadence,
        out=out,
        primary=primary,
        dataset=dataset,
        config=config,
        checkpoints=checkpoints,
        trainer=trainer,
        state=state,
        evaluator=Evaluator(dataset, config, problem, cadence.eval_samples),
        log=log,
        run_meta=run_meta,
        devices=len(devices),
        total=total,
        end=end,
        start=start,
        wall_before=wall_before,
    )


def _loop(session: _Session, stop: StopRequest | None) -> tuple[int, int]:
    """Chunks of ``Trainer.run`` up to ``session.end``, each logged (and evaluated, checkpointed)
    at its end; returns (the iteration reached, the signal that stopped it or 0)."""
    cadence, evaluator, trainer = session.cadence, session.evaluator, session.trainer
    it = int(host_copy(session.state.iteration))
    first, signum = True, 0
    with RunProgress(
        session.total, it, enabled=session.primary and session.options.progress
    ) as bar:
        while it < session.end:
            stop_at = _next_stop(
                it,
                session.end,
                cadence.log_every,
                cadence.checkpoint_every,
                cadence.eval_every if evaluator.evaluates else None,
            )
            try:
                session.state, metrics = trainer.run(session.state, stop_at - it)
                metrics = jax.device_get(metrics)
            except ValueError as err:  # lowering: a backend this platform cannot run
                backend = session.config.backend
                if first and backend not in ("auto", "xla"):
                    raise RunError(f"--backend {backend}: {err}") from None
                raise
            first = False
            fault = first_nonfinite_loss(metrics, it)
            if fault is None:
                fault = nonfinite_state(session.state)
                fault = fault and f"{fault} after step {stop_at}"
            it = stop_at
            if session.log is not None:
                _log_chunk(session, it, metrics, bar, evaluate=fault is None)
            if fault is not None:
                newest = session.checkpoints.latest_step()
                raise RunFailure(
                    f"training diverged: {fault}. No checkpoint was written after it; "
                    + (
                        f"the newest, step {newest}, holds finite values"
                        if newest is not None
                        else "the run has no checkpoint yet"
                    )
                )
            signum = _stop_signal(stop)
            if it % cadence.checkpoint_every == 0 or it == session.end or signum:
                session.save(it)
            if signum:
                break
    return it, signum


def _log_chunk(
    session: _Session, it: int, metrics: dict[str, Any], bar: RunProgress, *, evaluate: bool
) -> None:
    """Process 0: the chunk's line of metrics.jsonl (with the quality at evaluation points) and
    the progress bar."""
    evaluator, every = session.evaluator, session.cadence.eval_every
    quality = None
    if evaluate and evaluator.evaluates and (it % every == 0 or it == session.end):
        quality = evaluator.quality(host_copy(session.state.g_params), it)
    record = outputs.metrics_record(it, session.wall(), metrics, evaluator.record(quality))
    assert session.log is not None
    _write(f"{session.log.path}", session.log.append, record)
    bar.update(it, record)


def _finish(session: _Session, it: int, signum: int) -> dict[str, Any]:
    """The summary; process 0 also writes the samples, the figure and summary.json."""
    train_s = session.wall()
    session.checkpoints.close()
    out, evaluator = session.out, session.evaluator
    summary = {
        "dataset": session.dataset,
        "steps": it,
        "total_steps": session.total,
        "devices": session.devices,
        "processes": jax.process_count(),
    }
    if signum:
        summary["stopped_by"] = signal.Signals(signum).name
    if not session.primary:
        return summary
    assert session.log is not None
    host = host_copy(session.state)
    samples = evaluator.samples(host.g_params, max(session.cadence.eval_samples, 2500))
    _write(f"{out / outputs.SAMPLES}", outputs.write_samples, out, samples)
    quality = evaluator.quality(host.g_params, it)
    if quality is not None:
        summary.update(quality)
    summary["train_s"] = round(train_s, 1)
    title = f"{session.dataset}: {it} generator steps" + evaluator.headline(quality)
    _write(
        f"{out / outputs.FIGURE}",
        evaluator.figure,
        out / outputs.FIGURE,
        host,
        session.log.records,
        title,
    )
    summary.update(wall_s=round(session.wall(), 1), out=str(out))
    _write(f"{out / outputs.SUMMARY}", outputs.write_json, out / outputs.SUMMARY, summary)
    return summary


__all__ = [
    "DAMAGED",
    "DEFAULT_DATASET",
    "FLAGS",
    "Resumed",
    "RunError",
    "RunFailure",
    "RunOptions",
    "resolve",
    "train",
]
