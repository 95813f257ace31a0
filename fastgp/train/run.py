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
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from fastgp.penalty import grad_norms
from fastgp.train import outputs
from fastgp.train.checkpoints import (
    CheckpointDamaged,
    Checkpoints,
    CheckpointWriteError,
    host_copy,
    reason,
)
from fastgp.train.data import toy_modes
from fastgp.train.figures import plot_run
from fastgp.train.nonfinite import first_nonfinite_loss, nonfinite_state
from fastgp.train.penalty_tuning import choose_second_order
from fastgp.train.progress import RunProgress
from fastgp.train.quality import mode_quality
from fastgp.train.recipes import build_problem, default_config
from fastgp.train.runlock import DirectoryBusy, RunLock
from fastgp.train.state import ConfigError, TrainConfig, init_state
from fastgp.train.trainer import Trainer, make_mesh

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
    out: Path = Path("runs") / DEFAULT_DATASET
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
    see ``fastgp._backends`` for the compiled figures behind it; ``pallas`` forces the kernel)."""
    return "xla" if jax.default_backend() == "cpu" else "auto"


def _cadence(options: RunOptions, stored: dict) -> RunOptions:
    """``options`` with unset cadence fields taken from ``stored``, else from CADENCE."""
    return dataclasses.replace(
        options,
        **{k: getattr(options, k) or stored.get(k, default) for k, default in CADENCE.items()},
    )


def _flag_error(err: ConfigError, overrides: dict) -> RunError:
    """A TrainConfig error as a RunError naming the flags (with their values) it comes from."""
    given = [f"{FLAGS[f]} {overrides[f]}" for f in err.fields if f in FLAGS and f in overrides]
    named = given or [FLAGS.get(f, f) for f in err.fields]
    return RunError(f"{' with '.join(dict.fromkeys(named))}: {err}")


def _stored_run(step: int, meta: dict):
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
    meta: dict
    state: object


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
            for err in damaged:
                try:
                    moved = checkpoints.quarantine(err.step, out / DAMAGED)
                except OSError as move_err:
                    raise RunError(
                        f"--resume: {err}, and it cannot be moved to "
                        f"{out / DAMAGED} ({reason(move_err)})"
                    ) from None
                _warn(f"{err}; moved it to {moved}")
            _warn(f"resuming from checkpoint {step}, the newest intact one")
        _barrier("fastgp-resume-moved")
        checkpoints.reload()
    return Resumed(step, meta, state)


def resolve(
    options: RunOptions, overrides: dict, checkpoints: Checkpoints, *, primary: bool = True
):
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


def _tuning_line(config, tuning) -> str:
    """One line on what ``--second-order auto`` measured and chose."""
    times = ", ".join(
        f"{r.variant.second_order} {r.seconds * 1e3:.3g} ms" for r in tuning.results if r.seconds
    )
    return (
        f"--second-order auto: {config.second_order} (critic step on one device: {times}; "
        f"each checked against the naive penalty)"
    )


def _tuning_record(tuning) -> dict:
    return {
        "measured_on": tuning.measured_on,
        "seconds": {r.variant.second_order: r.seconds for r in tuning.results},
        "naive_seconds": tuning.naive.seconds,
        "gradient_error": {r.variant.second_order: r.gradient_error for r in tuning.results},
    }


def _barrier(name: str) -> None:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def _stop_signal(stop) -> int:
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


def _write(what: str, fn, *args):
    """Run an output writer; an OSError (disk full, read-only, ...) becomes a RunFailure."""
    try:
        return fn(*args)
    except OSError as err:
        raise RunFailure(f"cannot write {what} ({reason(err)})") from None


def _devices_error(
    config: TrainConfig, n: int, options: RunOptions, overrides: dict, resumed
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


def _next_stop(it: int, end: int, *periods) -> int:
    return min([end] + [(it // p + 1) * p for p in periods if p])


# Digits-metric keys logged in metrics.jsonl (the summary holds the whole metric).
DIGITS_RECORD = (
    "c2st_accuracy",
    "c2st_floor",
    "c2st_sigma",
    "frechet_distance",
    "frechet_spread",
    "frechet_sigma",
    "confidence",
    "classes_covered",
    "class_entropy",
)


class _Evaluator:
    """Host-side evaluation on this process's copy of the parameters (no collectives).

    Gaussian mixtures: modes captured and high-quality share (``fastgp.train.quality``). Digits:
    ``fastgp.train.digit_quality.DigitQuality`` (built at the first evaluation, then reused) on at
    least its ``sets_wanted`` generator samples. Swiss roll: no evaluation."""

    def __init__(self, dataset, config, problem, n):
        self.config, self.problem, self.n = config, problem, n
        self.dataset = dataset
        self.modes = None if problem.image or dataset == "swissroll" else toy_modes(dataset)
        self._digits = None
        self._last = None  # (step, quality) of the latest evaluation
        self.key = jax.random.PRNGKey(config.seed + 10_000)
        latent = config.latent_dim
        gen, critic = problem.generator, problem.critic
        self._sample = jax.jit(
            lambda p, key, n: gen.apply(
                p, jax.random.normal(key, (n, latent), jnp.float32), dtype=config.dtype
            ),
            static_argnums=2,
        )
        self._critic = jax.jit(lambda p, x: critic.apply(p, x, dtype=config.dtype))
        self._norms = jax.jit(
            lambda p, x: grad_norms(
                jax.grad(lambda y: jnp.sum(critic.apply(p, y, dtype=config.dtype)))(x),
                backend="xla",
            )
        )

    def samples(self, g_params, n=None):
        return np.asarray(self._sample(g_params, self.key, n or self.n), np.float32)

    @property
    def evaluates(self) -> bool:
        """Whether this dataset has a quality evaluation (runs stop at --eval-every for it)."""
        return self.modes is not None or self.dataset == "digits"

    def digits_metric(self):
        if self._digits is None:
            from fastgp.train.digit_quality import DigitQuality

            self._digits = DigitQuality()
        return self._digits

    def quality(self, g_params, step):
        """The quality of the generator at ``step`` (computed once per step), or None.

        Gaussian mixtures: {"modes", "high_quality", "total_modes"}; digits: the
        ``DigitQuality`` metric (C2ST, Frechet distance and confidence with their real-vs-real
        floors and equivalent noise sigmas, class coverage)."""
        if not self.evaluates:
            return None
        if self._last is not None and self._last[0] == step:
            return self._last[1]
        if self.modes is not None:
            q = mode_quality(self.samples(g_params), *self.modes)
            q = {**q, "high_quality": round(q["high_quality"], 2)}
        else:
            metric = self.digits_metric()
            q = metric(self.samples(g_params, max(self.n, metric.sets_wanted)))
        self._last = (step, q)
        return q

    @staticmethod
    def record(quality):
        """The part of ``quality`` that goes into a metrics.jsonl line."""
        if quality is None or "c2st_accuracy" not in quality:
            return quality
        return {k: quality[k] for k in DIGITS_RECORD}

    @staticmethod
    def headline(quality) -> str:
        """``quality`` in a few words, for the figure's title ("" if None)."""
        if quality is None:
            return ""
        if "modes" in quality:
            return (
                f", {quality['modes']}/{quality['total_modes']} modes, "
                f"{quality['high_quality']:.1f}% high quality"
            )
        return (
            f", C2ST {quality['c2st_accuracy']:.3f} (real {quality['c2st_floor']:.3f}, "
            f"noise sigma {quality['c2st_sigma']:.3f}), FD {quality['frechet_distance']:.2f} "
            f"(real {quality['frechet_floor']:.2f}), {quality['classes_covered']}/10 classes"
        )

    def figure(self, path, state, records, title):
        g_params, d_params = state.g_params, state.d_params
        k_real, k_alpha = jax.random.split(jax.random.fold_in(self.key, 1))
        real = np.asarray(self.problem.sample_real(k_real, self.n), np.float32)
        fake = self.samples(g_params)
        alpha = np.asarray(jax.random.uniform(k_alpha, (self.n,)), np.float32)
        alpha = alpha.reshape((-1,) + (1,) * (real.ndim - 1))
        norms = np.asarray(self._norms(d_params, real + alpha * (fake - real)))
        grid = None
        if real.ndim == 2:
            both = np.concatenate([real, fake[np.all(np.isfinite(fake), 1)]])
            lo, hi = np.percentile(both, 0.5, 0) - 0.5, np.percentile(both, 99.5, 0) + 0.5
            xs, ys = np.linspace(lo[0], hi[0], 120), np.linspace(lo[1], hi[1], 120)
            mesh = np.stack(np.meshgrid(xs, ys), -1).reshape(-1, 2).astype(np.float32)
            grid = (xs, ys, np.asarray(self._critic(d_params, mesh)).reshape(len(ys), len(xs)))
        plot_run(path, real, fake, norms, records, critic_grid=grid, title=title)


def train(options: RunOptions, overrides: dict, stop=None) -> dict:
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


def _train(options: RunOptions, overrides: dict, stop) -> dict:
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
    total = config.total_steps
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
            _warn(_tuning_line(config, tuned))
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
    evaluator = _Evaluator(dataset, config, problem, options.eval_samples)
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
                **({} if tuned is None else {"second_order_tuning": _tuning_record(tuned)}),
            },
        )

    def wall():
        return wall_before + time.perf_counter() - start

    def save(step):
        try:
            checkpoints.save(step, state, {**run_meta, "wall_s": wall()})
        except CheckpointWriteError as err:
            newest = checkpoints.latest_step()
            raise RunFailure(
                f"{err}. The run stopped at step {step}; "
                + (
                    f"its newest checkpoint is step {newest} (--resume continues from it)"
                    if newest is not None
                    else "it has no checkpoint yet"
                )
            ) from None

    first, signum = True, 0
    with RunProgress(total, it, enabled=primary and options.progress) as bar:
        while it < end:
            stop_at = _next_stop(
                it,
                end,
                options.log_every,
                options.checkpoint_every,
                options.eval_every if evaluator.evaluates else None,
            )
            try:
                state, metrics = trainer.run(state, stop_at - it)
                metrics = jax.device_get(metrics)
            except ValueError as err:  # lowering: a backend this platform cannot run
                if first and config.backend not in ("auto", "xla"):
                    raise RunError(f"--backend {config.backend}: {err}") from None
                raise
            first = False
            fault = first_nonfinite_loss(metrics, it)
            if fault is None:
                fault = nonfinite_state(state)
                fault = fault and f"{fault} after step {stop_at}"
            it = stop_at
            if primary:
                quality = None
                if (
                    fault is None
                    and evaluator.evaluates
                    and (it % options.eval_every == 0 or it == end)
                ):
                    quality = evaluator.quality(host_copy(state.g_params), it)
                record = outputs.metrics_record(it, wall(), metrics, evaluator.record(quality))
                _write(f"{log.path}", log.append, record)
                bar.update(it, record)
            if fault is not None:
                newest = checkpoints.latest_step()
                raise RunFailure(
                    f"training diverged: {fault}. No checkpoint was written after it; "
                    + (
                        f"the newest, step {newest}, holds finite values"
                        if newest is not None
                        else "the run has no checkpoint yet"
                    )
                )
            signum = _stop_signal(stop)
            if it % options.checkpoint_every == 0 or it == end or signum:
                save(it)
            if signum:
                break
    train_s = wall()
    checkpoints.close()

    summary = {
        "dataset": dataset,
        "steps": it,
        "total_steps": total,
        "devices": len(devices),
        "processes": jax.process_count(),
    }
    if signum:
        summary["stopped_by"] = signal.Signals(signum).name
    if not primary:
        return summary
    host = host_copy(state)
    samples = evaluator.samples(host.g_params, max(options.eval_samples, 2500))
    _write(f"{out / outputs.SAMPLES}", outputs.write_samples, out, samples)
    quality = evaluator.quality(host.g_params, it)
    if quality is not None:
        summary.update(quality)
    summary["train_s"] = round(train_s, 1)
    title = f"{dataset}: {it} generator steps" + evaluator.headline(quality)
    _write(
        f"{out / outputs.FIGURE}", evaluator.figure, out / outputs.FIGURE, host, log.records, title
    )
    summary.update(wall_s=round(wall(), 1), out=str(out))
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
