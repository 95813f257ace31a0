"""The ``fastgp`` command line: the parsed flags checked together, and dispatch.

    fastgp train [--dataset 8gaussians] [--devices N] [--processes P] [--out DIR] [--resume] ...
    fastgp check --devices N [--processes P] --steps K --batch-size B [--dataset digits]
    fastgp tune MODULE:FUNCTION [--generation v5e]   (fastgp.train.cli.tune)
    python -m fastgp.train.cli ARGS                  the same as: fastgp ARGS (``__main__.py``)

``--devices N`` gives each process N simulated CPU devices (``launcher.with_cpu_devices``: set
before JAX starts, or the command runs again in a fresh interpreter). ``--processes P`` starts P
local processes (``fastgp.train.cli.launcher``) that form one JAX job over P*N devices; the command
runs in each, process 0 prints and writes the outputs. The parser is
``fastgp.train.cli.parser.build_parser``.

Exit status of ``train``: 0 done; 2 a bad flag or --out (one line naming it); 1 the run failed
(a checkpoint or output could not be written, or training diverged); 128 + N stopped by signal N
(SIGTERM 143, SIGINT 130) after writing a checkpoint and the outputs.
"""

import argparse
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from fastgp.train.cli import tune
from fastgp.train.cli.launcher import (
    check_port,
    free_port,
    set_cpu_devices,
    start_distributed,
    supervise,
    with_cpu_devices,
)
from fastgp.train.cli.parser import CHECK_OPTIONS, FUSED, build_parser, overrides
from fastgp.train.config import TrainConfig
from fastgp.train.recipes.defaults import recipe, vit_shape
from fastgp.train.run import check

# --- dispatch ------------------------------------------------------------------------------------


def _subparser(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> argparse.ArgumentParser:
    (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    parsers: dict[str, argparse.ArgumentParser] = commands.choices
    return parsers[args.command]


def backend_problem(backend: str | None, platform: str | None = None) -> str | None:
    """Why the sharded trainer cannot use ``backend`` (on ``platform``, if known), or None."""
    if backend in ("interpret", "gpu-interpret"):
        return (
            f"{backend} (generic Pallas interpret mode) cannot run under shard_map, which the "
            f"trainer always uses; use tpu-interpret to run the kernel on CPU, or xla"
        )
    if platform in ("cuda", "rocm"):
        platform = "gpu"
    if backend == "pallas" and platform not in (None, "tpu", "gpu"):
        return (
            f"pallas runs the kernels on TPU or GPU only and JAX runs on {platform} here; "
            f"use auto (the default), xla, or tpu-interpret to run the TPU kernel on CPU"
        )
    return None


def critic_problem(args: argparse.Namespace) -> str | None:
    """Why --critic cannot go with --dataset (when both are known before the run), or None."""
    if args.command == "train" and args.resume and args.dataset is None:
        return None  # the checkpoint's dataset; a --critic that contradicts it is refused there
    dataset = args.dataset or "8gaussians"  # train's default, as in _out
    try:
        recipe(dataset, args.critic or "conv")
    except ValueError as err:
        return str(err)
    return None


def recipe_problem(args: argparse.Namespace) -> str | None:
    """Why --recipe has no recipe for --dataset and --critic, or None."""
    name = getattr(args, "recipe", None)
    if name is None or (args.resume and args.dataset is None):
        return None  # resumed: the checkpoint's dataset, and its recipe is compared there
    try:
        recipe(args.dataset or "8gaussians", args.critic or "conv", name)
    except ValueError as err:
        return str(err)
    return None


def patch_problem(args: argparse.Namespace) -> str | None:
    """Why --vit-patch cannot go with --critic and --dataset, or None."""
    patch = getattr(args, "vit_patch", None)
    if patch is None:
        return None
    if args.critic != "vit":
        return "the patch side of --critic vit; give --critic vit"
    try:
        vit_shape(args.dataset or "8gaussians", patch)
    except (KeyError, ValueError) as err:
        return str(err)
    return None


def dataset_problem(dataset: str | None) -> str | None:
    """Why ``dataset`` cannot be read on this installation (MNIST without its package), or None."""
    if dataset != "mnist":
        return None
    from fastgp.train.data.sets import mnist_file

    try:
        mnist_file()
    except ImportError as err:
        return str(err)
    return None


def _known_platform(args: argparse.Namespace) -> str | None:
    """The JAX platform, when it is known without starting JAX (JAX_PLATFORMS names one)."""
    platforms = os.environ.get("JAX_PLATFORMS", "")
    if not platforms and args.processes > 1 and args.process_id is None:
        return "cpu"  # the supervisor starts its processes on CPU
    return platforms if platforms and "," not in platforms else None


def _validate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    sub = _subparser(parser, args)
    if (args.process_id is None) != (args.coordinator is None) or (
        args.process_id is not None and not 0 <= args.process_id < args.processes
    ):
        sub.error(
            "argument --process-id: give it with --coordinator HOST:PORT, in "
            "0..--processes-1 (the supervisor started by --processes sets both)"
        )
    if args.processes > 1 and args.process_id is None and args.port is not None:
        try:
            check_port(args.port)
        except OSError as err:
            sub.error(f"argument --port: {err}")
    if args.processes > 1 and args.backend and "interpret" in args.backend:
        sub.error(
            f"argument --backend: {args.backend} (Pallas interpret mode) runs within one "
            f"process only and hangs across processes; use --backend xla with "
            f"--processes {args.processes}"
        )
    problem = backend_problem(args.backend, _known_platform(args))
    if problem:
        sub.error(f"argument --backend: {problem}")
    if args.command == "train":
        from fastgp.train.run.outputs import out_problem

        problem = out_problem(_out(args), args.resume)
        if problem:
            sub.error(f"argument --out: {problem}")
    problem = critic_problem(args)
    if problem:
        sub.error(f"argument --critic: {problem}")
    problem = recipe_problem(args)
    if problem:
        sub.error(f"argument --recipe: {problem}")
    problem = patch_problem(args)
    if problem:
        sub.error(f"argument --vit-patch: {problem}")
    problem = dataset_problem(args.dataset)
    if problem:
        sub.error(f"argument --dataset: {problem}")
    devices = (args.devices or 1) * args.processes
    if args.batch_size is not None and args.batch_size % devices:
        sub.error(
            f"argument --batch-size: {args.batch_size} is not divisible by the {devices} "
            f"devices (--devices {args.devices or 1} x --processes {args.processes}); use "
            f"a multiple of {devices}"
        )


def _supervise(args: argparse.Namespace, argv: list[str]) -> int:
    """Start ``args.processes`` copies of this command, one per process id."""
    port = args.port or free_port()
    env = set_cpu_devices(args.devices or 1, dict(os.environ))
    env.setdefault("JAX_PLATFORMS", "cpu")
    base = [sys.executable, "-m", "fastgp.train.cli", *argv]
    commands = [
        base + ["--process-id", str(i), "--coordinator", f"127.0.0.1:{port}"]
        for i in range(args.processes)
    ]
    return supervise(commands, env, graceful=args.command == "train")


def _out(args: argparse.Namespace) -> str:
    return args.out or os.path.join("runs", args.dataset or "8gaussians")


def _train(args: argparse.Namespace) -> int:
    import jax

    from fastgp.train.run.loop import train
    from fastgp.train.run.options import RunError, RunFailure
    from fastgp.train.run.signals import StopRequest

    out = _out(args)
    options = _run_options(args, out)
    given = overrides(args)
    primary = jax.process_index() == 0
    stop = StopRequest(announce=primary).install()
    try:
        summary = train(options, given, stop)
    except (RunError, RunFailure) as err:
        if primary or jax.process_count() == 1:
            print(f"fastgp train: error: {err}", file=sys.stderr, flush=True)
        return 2 if isinstance(err, RunError) else 1
    finally:
        stop.uninstall()
    if "out" in summary:
        print(json.dumps(summary), flush=True)
    if "stopped_by" not in summary:
        return 0
    if primary:
        print(
            f"fastgp train: stopped by {summary['stopped_by']} at step {summary['steps']} of "
            f"{summary['total_steps']}; checkpoint {summary['steps']} and the outputs are in "
            f"{out}; continue with: fastgp train --resume --out {out}",
            file=sys.stderr,
            flush=True,
        )
    return 128 + signal.Signals[summary["stopped_by"]].value


def _run_options(args: argparse.Namespace, out: str) -> Any:
    """train's per-invocation flags as a ``fastgp.train.run.options.RunOptions``."""
    from fastgp.train.run.options import RunOptions

    return RunOptions(
        dataset=args.dataset,
        recipe=args.recipe,
        out=out,
        log_every=args.log_every,
        checkpoint_every=args.checkpoint_every,
        eval_every=args.eval_every,
        eval_samples=args.eval_samples,
        stop_at=args.stop_at,
        resume=args.resume,
        progress=not args.no_progress,
        devices=None if args.devices is None else args.devices * args.processes,
        fused=FUSED[args.fused],
    )


def fresh_run(argv: Sequence[str]) -> tuple[str, TrainConfig]:
    """(dataset, TrainConfig) that ``fastgp train ARGV`` trains in a fresh --out: its recipe and
    flags resolved as the command resolves them (``fastgp.train.run.resolve.fresh``); a bad
    flag exits as the command does, a run it cannot train is a RunError."""
    from fastgp.train.run.resolve import fresh

    args = build_parser().parse_args(["train", *argv])
    return fresh(_run_options(args, _out(args)), overrides(args))


def _check(args: argparse.Namespace) -> int:
    import jax

    if jax.local_device_count() < args.devices:
        print(
            f"fastgp check: error: argument --devices: {args.devices} devices per process "
            f"requested but only {jax.local_device_count()} {jax.default_backend()} devices "
            f"are visible",
            file=sys.stderr,
            flush=True,
        )
        return 2
    result = check.run_check(
        args.devices if jax.process_count() == 1 else jax.device_count(),
        args.steps,
        args.batch_size,
        **{name: getattr(args, name) for name in CHECK_OPTIONS},
    )
    if jax.process_index() == 0:
        print(json.dumps(result), flush=True)
    return 0 if result["ok"] else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``fastgp`` script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # orbax logs every failure with its traceback through absl; the command says it in one line
    # (CheckpointWriteError, CheckpointDamaged). Set here, not at import: programs that import
    # fastgp.train keep their own logging.
    logging.getLogger("absl").setLevel(logging.CRITICAL)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "tune":
        return tune.run(args)
    _validate(parser, args)
    if args.processes > 1 and args.process_id is None:
        return _supervise(args, argv)
    if args.devices is not None:
        status = with_cpu_devices(args.devices, "fastgp.train.cli", argv)
        if status is not None:
            return status
    if args.process_id is not None:
        start_distributed(args.coordinator, args.processes, args.process_id)
    if args.backend == "pallas":
        import jax

        problem = backend_problem(args.backend, jax.default_backend())
        if problem:
            _subparser(parser, args).error(f"argument --backend: {problem}")
    return {"train": _train, "check": _check}[args.command](args)


__all__ = [
    "backend_problem",
    "critic_problem",
    "dataset_problem",
    "fresh_run",
    "main",
    "patch_problem",
    "recipe_problem",
]
