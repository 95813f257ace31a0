"""One ``fastgp train`` run: the chunked training loop, evaluation, logs, checkpoints, outputs.

    summary = train(RunOptions(dataset=None, out=Path("runs/8gaussians")), overrides={})

``overrides`` maps TrainConfig fields to values given on the command line; the rest come from
``fastgp.train.recipes.defaults`` (fresh run) or from the checkpoint (``resume``; a flag that
contradicts the checkpoint is an error naming it). Training runs in chunks of ``Trainer.run`` that
end on multiples of ``log_every``, ``eval_every`` and ``checkpoint_every``; each chunk end is one
line of metrics.jsonl. Random numbers depend only on (seed, iteration), so a run continued from a
checkpoint reaches the same parameters as one that never stopped. Every process runs this loop;
process 0 alone logs, evaluates and writes outputs (checkpoints are written collectively).

Faults end a run with one message: flags and the output directory raise :class:`RunError` (checked
before training starts); a checkpoint or output that cannot be written and non-finite losses or
parameters raise :class:`RunFailure` (the newest checkpoint on disk stays the last finite one).
Process 0 holds ``fastgp.train.run.lock`` on --out for the whole run. ``--resume`` continues from
the newest intact checkpoint: damaged newer ones are reported and moved to ``checkpoints-damaged/``.
With a ``fastgp.train.run.signals.StopRequest`` a signal ends the run at the next chunk end, after a
checkpoint and the outputs (the summary then says ``stopped_by``).

Here: the loop and the outputs at its end. ``fastgp.train.run.options`` holds RunOptions and the
errors, ``fastgp.train.run.resolve`` which run this is (recipe or checkpoint), and
``fastgp.train.run.session`` everything before the first step.
"""

import signal
from pathlib import Path
from typing import Any

import jax
import numpy as np

from fastgp.train.run import outputs
from fastgp.train.run.checkpoints import host_copy
from fastgp.train.run.options import RunError, RunFailure, RunOptions, write_output
from fastgp.train.run.progress import RunProgress
from fastgp.train.run.session import Session, prepare_out, setup
from fastgp.train.run.signals import StopRequest
from fastgp.train.trainers.averaging import sampling_params
from fastgp.train.trainers.nonfinite import first_nonfinite_loss, nonfinite_state


def train(
    options: RunOptions, overrides: dict[str, Any], stop: StopRequest | None = None
) -> dict[str, Any]:
    """Run (or continue) training; returns the summary (process 0 also writes it to --out).

    ``stop``: a ``fastgp.train.run.signals.StopRequest`` whose signal ends the run at the next chunk
    end (every process stops at the same step). Raises RunError or RunFailure."""
    out = Path(options.out)
    lock = prepare_out(out, options.resume) if jax.process_index() == 0 else None
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
    session = setup(options, overrides)
    it, signum = _loop(session, stop)
    return _finish(session, it, signum)


def _stop_signal(stop: StopRequest | None) -> int:
    """The signal number a stop was requested with on any process (0: none)."""
    signum = (stop.signum or 0) if stop is not None else 0
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        signum = int(np.max(multihost_utils.process_allgather(np.int32(signum))))
    return signum


def _next_stop(it: int, end: int, *periods: int | None) -> int:
    return min([end] + [(it // p + 1) * p for p in periods if p])


def _loop(session: Session, stop: StopRequest | None) -> tuple[int, int]:
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
    session: Session, it: int, metrics: dict[str, Any], bar: RunProgress, *, evaluate: bool
) -> None:
    """Process 0: the chunk's line of metrics.jsonl (with the quality at evaluation points) and
    the progress bar."""
    evaluator, every = session.evaluator, session.cadence.eval_every
    quality = None
    if evaluate and evaluator.evaluates and (it % every == 0 or it == session.end):
        g_params = sampling_params(host_copy(session.state), session.config.g_average)
        quality = evaluator.quality(g_params, it)
    record = outputs.metrics_record(it, session.wall(), metrics, evaluator.record(quality))
    assert session.log is not None
    write_output(f"{session.log.path}", session.log.append, record)
    bar.update(it, record)


def _finish(session: Session, it: int, signum: int) -> dict[str, Any]:
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
    g_params = sampling_params(host, session.config.g_average)
    samples = evaluator.samples(g_params, max(session.cadence.eval_samples, 2500))
    write_output(f"{out / outputs.SAMPLES}", outputs.write_samples, out, samples)
    quality = evaluator.quality(g_params, it)
    if quality is not None:
        summary.update(quality)
    summary["train_s"] = round(train_s, 1)
    title = f"{session.dataset}: {it} generator steps" + evaluator.headline(quality)
    write_output(
        f"{out / outputs.FIGURE}",
        evaluator.figure,
        out / outputs.FIGURE,
        host,
        session.log.records,
        title,
    )
    summary.update(wall_s=round(session.wall(), 1), out=str(out))
    write_output(f"{out / outputs.SUMMARY}", outputs.write_json, out / outputs.SUMMARY, summary)
    return summary


__all__ = ["train"]
