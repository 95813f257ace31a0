"""Everything a ``fastgp train`` invocation does before its first step, gathered in a Session.

    lock = prepare_out(out, resume)          # process 0: --out created and locked (RunError)
    session = setup(options, overrides)      # config, trainer, state, evaluator, logs, run.json

``setup`` resolves the run (``fastgp.train.run.resolve``), the cadence (flags, else the
checkpoint's, else ``CADENCE``), the devices of the mesh (a batch size they do not divide is a
RunError naming the flag to change), ``--second-order auto`` (``fastgp.train.run.penalty_tuning``),
the Trainer and its state (fresh or the checkpoint's), and on process 0 opens metrics.jsonl and
writes run.json: the dataset, the recipe taken by name (null: the dataset's own), every field of
the resolved TrainConfig, the cadence and the code of each invocation (``code``: its commit,
whether the checkout was dirty, the step it started from; ``outputs.source_commit``), kept
in every checkpoint so that a resumed run lists each. ``fastgp.train.run.loop`` drives the Session
from there.
"""

import dataclasses
import time
from pathlib import Path
from typing import Any, NamedTuple

import jax

from fastgp.autotune import Tuning
from fastgp.train.config import TrainConfig
from fastgp.train.recipes.defaults import Problem, build_problem
from fastgp.train.run import outputs
from fastgp.train.run.checkpoints import Checkpoints, CheckpointWriteError, host_copy, reason
from fastgp.train.run.evaluation import Evaluator
from fastgp.train.run.lock import DirectoryBusy, RunLock
from fastgp.train.run.options import CADENCE, RunError, RunFailure, RunOptions, warn, write_output
from fastgp.train.run.penalty_tuning import choose_second_order, tuning_line, tuning_record
from fastgp.train.run.resolve import Resumed, resolve
from fastgp.train.trainers.state import TrainState
from fastgp.train.trainers.trainer import Trainer, make_mesh


class Cadence(NamedTuple):
    """The cadence of this invocation, every field of ``CADENCE`` resolved."""

    log_every: int
    checkpoint_every: int
    eval_every: int
    eval_samples: int


@dataclasses.dataclass
class Session:
    """One invocation's run, from :func:`setup` through ``fastgp.train.run.loop``'s loop to its
    outputs."""

    options: RunOptions
    cadence: Cadence
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


def prepare_out(out: Path, resume: bool) -> RunLock:
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


def setup(options: RunOptions, overrides: dict[str, Any]) -> Session:
    """The config, the trainer and its state (fresh or resumed), the evaluator, metrics.jsonl
    and run.json: everything before the first step."""
    start = time.perf_counter()
    out = Path(options.out)
    primary = jax.process_index() == 0
    checkpoints = _open_checkpoints(out)
    dataset, config, resumed = resolve(options, overrides, checkpoints, primary=primary)
    options = _cadence(options, {} if resumed is None else resumed.meta.get("cadence", {}))
    cadence = Cadence(*(int(getattr(options, k)) for k in CADENCE))
    total = config.total_steps
    assert total is not None  # resolve() sets it
    problem = build_problem(dataset, config)
    devices = _mesh_devices(config, options, overrides, resumed)
    config, tuned = _tuned(config, problem, len(devices), primary)
    trainer = _trainer(config, problem, devices, options.fused)
    state = trainer.init()
    if resumed is not None:
        state = trainer.replicate(resumed.state)
    it = int(host_copy(state.iteration))
    log = _metrics_log(out, it) if primary else None
    run_meta = {
        "dataset": dataset,
        "recipe": options.recipe if resumed is None else resumed.meta.get("recipe"),
        "config": dataclasses.asdict(config),
        "cadence": {k: getattr(options, k) for k in CADENCE},
        "code": _code(resumed, it),
    }
    if primary:
        _write_run_json(out, run_meta, len(devices), trainer.fused, tuned)
    return Session(
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
        end=min(total, options.stop_at) if options.stop_at else total,
        start=start,
        wall_before=0.0 if resumed is None else float(resumed.meta.get("wall_s", 0.0)),
    )


def _code(resumed: Resumed | None, iteration: int) -> list[dict[str, Any]]:
    """The code of each invocation of the run: the checkpoint's list (older checkpoints hold
    none), then this one's source from ``iteration``."""
    before = [] if resumed is None else list(resumed.meta.get("code", []))
    return [*before, {**outputs.source_commit(), "from_step": iteration}]


def _open_checkpoints(out: Path) -> Checkpoints:
    """The run's checkpoint directory in --out; RunError naming --out if it cannot be used."""
    try:
        return Checkpoints(out / outputs.CHECKPOINTS)
    except OSError as err:
        raise RunError(
            f"--out {out}: cannot use {out / outputs.CHECKPOINTS} ({reason(err)})"
        ) from None


def _cadence(options: RunOptions, stored: dict[str, Any]) -> RunOptions:
    """``options`` with unset cadence fields taken from ``stored``, else from CADENCE."""
    return dataclasses.replace(
        options,
        **{k: getattr(options, k) or stored.get(k, default) for k, default in CADENCE.items()},
    )


def _mesh_devices(
    config: TrainConfig,
    options: RunOptions,
    overrides: dict[str, Any],
    resumed: Resumed | None,
) -> list[Any]:
    """The mesh's devices: the first ``--devices`` visible ones (default all); RunError when
    their number does not divide the batch size."""
    devices = jax.devices()
    if options.devices:
        devices = devices[: options.devices]
    if config.batch_size % len(devices):
        raise _devices_error(config, len(devices), options, overrides, resumed)
    return devices


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


def _tuned(
    config: TrainConfig, problem: Problem, devices: int, primary: bool
) -> tuple[TrainConfig, Tuning | None]:
    """``config`` with ``second_order="auto"`` resolved at the per-device batch (process 0 says
    what it measured), and the measurements; else ``config`` and None."""
    if config.second_order != "auto":
        return config, None
    config, tuned = choose_second_order(config, problem, config.batch_size // devices)
    if primary:
        warn(tuning_line(config, tuned))
    return config, tuned


def _trainer(
    config: TrainConfig, problem: Problem, devices: list[Any], fused: bool | None
) -> Trainer:
    """The run's Trainer on a mesh of ``devices``; a backend it cannot use is a RunError."""
    try:
        return Trainer(
            config,
            problem.generator,
            problem.critic,
            problem.sample_real,
            mesh=make_mesh(devices),
            fused=fused,
        )
    except ValueError as err:
        raise RunError(
            f"--backend {config.backend}: {err}" if "backend" in str(err) else str(err)
        ) from None


def _metrics_log(out: Path, iteration: int) -> outputs.MetricsLog:
    """Process 0: metrics.jsonl opened to append, its lines past ``iteration`` dropped."""
    return write_output(
        f"{out / outputs.METRICS}", lambda: outputs.MetricsLog(out, keep_until=iteration)
    )


def _write_run_json(
    out: Path, run_meta: dict[str, Any], devices: int, fused: bool, tuned: Tuning | None
) -> None:
    """Process 0: run.json, the run's metadata with this invocation's devices, processes, how
    ``Trainer.run`` goes and what ``--second-order auto`` measured."""
    write_output(
        f"{out / outputs.RUN}",
        outputs.write_json,
        out / outputs.RUN,
        {
            **run_meta,
            "devices": devices,
            "processes": jax.process_count(),
            "fused": fused,
            **({} if tuned is None else {"second_order_tuning": tuning_record(tuned)}),
        },
    )


__all__ = ["Cadence", "Session", "prepare_out", "setup"]
