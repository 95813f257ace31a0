"""One ``fastgp train`` run: the chunked training loop, evaluation, logs, checkpoints, outputs.

    summary = train(RunOptions(dataset=None, out=Path("runs/8gaussians")), overrides={})

``overrides`` maps TrainConfig fields to values given on the command line; the rest come from
``fastgp.train.recipes`` (fresh run) or from the checkpoint (``resume``; a flag that contradicts the
checkpoint is an error naming it). Training runs in chunks of ``Trainer.run`` that end on
multiples of ``log_every``, ``eval_every`` and ``checkpoint_every``; each chunk end is one line of
metrics.jsonl. Random numbers depend only on (seed, iteration), so a run continued from a
checkpoint reaches the same parameters as one that never stopped. Every process runs this loop;
process 0 alone logs, evaluates and writes outputs (checkpoints are written collectively).
"""

import dataclasses
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from fastgp.train import outputs
from fastgp.train.checkpoints import Checkpoints, host_copy
from fastgp.train.data import toy_modes
from fastgp.train.figures import plot_run
from fastgp.penalty import grad_norms
from fastgp.train.progress import RunProgress
from fastgp.train.quality import mode_quality
from fastgp.train.recipes import build_problem, default_config
from fastgp.train.state import TrainConfig
from fastgp.train.trainer import Trainer, make_mesh

DEFAULT_DATASET = "8gaussians"
# TrainConfig field -> the command-line flag that sets it (for error messages).
FLAGS = {"total_steps": "--steps", "batch_size": "--batch-size", "backend": "--backend",
         "precision": "--precision", "gp_every": "--gp-every", "gp_kind": "--gp-kind",
         "second_order": "--second-order",
         "gp_weight": "--gp-weight", "seed": "--seed", "n_critic": "--n-critic",
         "lr_g": "--lr", "lr_d": "--lr", "decay_fraction": "--decay-fraction"}
# Fields a resumed run may change: they do not alter what is computed, only how.
CHANGEABLE_ON_RESUME = ("backend",)


# Defaults of the per-invocation cadence (a resumed run keeps its checkpoint's values).
CADENCE = {"log_every": 100, "checkpoint_every": 1000, "eval_every": 500, "eval_samples": 2500}


class RunError(ValueError):
    """A problem with the run's flags or output directory (message names the flag)."""


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """Per-invocation settings (not part of the checkpointed config)."""

    dataset: str | None = None       # None: the default, or the checkpoint's when resuming
    out: Path = Path("runs") / DEFAULT_DATASET
    # None: the checkpoint's value when resuming, else CADENCE's
    log_every: int | None = None
    checkpoint_every: int | None = None
    eval_every: int | None = None
    eval_samples: int | None = None
    stop_at: int | None = None       # end this invocation at this iteration (checkpointed)
    resume: bool = False
    progress: bool = True
    devices: int | None = None       # mesh size (default: every visible device)


def default_backend() -> str:
    """"xla" on CPU (the fast path there; the kernel's interpret modes are for checks), else
    "auto" (the Pallas kernel where the program is lowered for TPU or GPU)."""
    return "xla" if jax.default_backend() == "cpu" else "auto"


def _cadence(options: RunOptions, stored: dict) -> RunOptions:
    """``options`` with unset cadence fields taken from ``stored``, else from CADENCE."""
    return dataclasses.replace(options, **{
        k: getattr(options, k) or stored.get(k, default) for k, default in CADENCE.items()})


def resolve(options: RunOptions, overrides: dict, checkpoints: Checkpoints):
    """(dataset, TrainConfig, resume step or None, wall seconds already spent)."""
    step = checkpoints.latest_step()
    if step is not None and not options.resume:
        raise RunError(f"--out {options.out} already holds checkpoints (latest step {step}); "
                       f"pass --resume to continue that run or choose another --out")
    if step is None:
        dataset = options.dataset or DEFAULT_DATASET
        overrides = {"backend": default_backend(), **overrides}
        try:
            return dataset, default_config(dataset, **overrides), None, 0.0
        except ValueError as err:
            raise RunError(str(err)) from None
    meta = checkpoints.meta(step)
    if options.dataset not in (None, meta["dataset"]):
        raise RunError(f"--dataset {options.dataset} contradicts the checkpoint in "
                       f"{options.out} (dataset {meta['dataset']}); drop --dataset or choose "
                       f"another --out")
    stored = dict(meta["config"], betas=tuple(meta["config"]["betas"]))
    for field, value in overrides.items():
        if value is not None and value != stored[field] and field not in CHANGEABLE_ON_RESUME:
            raise RunError(f"{FLAGS.get(field, field)} {value} contradicts the checkpoint in "
                           f"{options.out} ({field}={stored[field]}); drop the flag to resume")
    stored.update({k: v for k, v in overrides.items() if k in CHANGEABLE_ON_RESUME and v})
    return meta["dataset"], TrainConfig(**stored), step, float(meta.get("wall_s", 0.0))


def _next_stop(it: int, end: int, *periods) -> int:
    return min([end] + [(it // p + 1) * p for p in periods if p])


class _Evaluator:
    """Host-side evaluation on this process's copy of the parameters (no collectives)."""

    def __init__(self, dataset, config, problem, n):
        self.config, self.problem, self.n = config, problem, n
        self.modes = None if problem.image or dataset == "swissroll" else toy_modes(dataset)
        self.key = jax.random.PRNGKey(config.seed + 10_000)
        latent = config.latent_dim
        gen, critic = problem.generator, problem.critic
        self._sample = jax.jit(lambda p, key, n: gen.apply(p, jax.random.normal(
            key, (n, latent), jnp.float32), dtype=config.dtype), static_argnums=2)
        self._critic = jax.jit(lambda p, x: critic.apply(p, x, dtype=config.dtype))
        self._norms = jax.jit(lambda p, x: grad_norms(jax.grad(
            lambda y: jnp.sum(critic.apply(p, y, dtype=config.dtype)))(x), backend="xla"))

    def samples(self, g_params, n=None):
        return np.asarray(self._sample(g_params, self.key, n or self.n), np.float32)

    def quality(self, g_params):
        """{"modes", "high_quality", "total_modes"} for Gaussian mixtures, else None."""
        if self.modes is None:
            return None
        q = mode_quality(self.samples(g_params), *self.modes)
        return {**q, "high_quality": round(q["high_quality"], 2)}

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


def train(options: RunOptions, overrides: dict) -> dict:
    """Run (or continue) training; returns the summary (process 0 also writes it to --out)."""
    start = time.perf_counter()
    out = Path(options.out)
    primary = jax.process_index() == 0
    if primary:
        out.mkdir(parents=True, exist_ok=True)
    checkpoints = Checkpoints(out / outputs.CHECKPOINTS)
    dataset, config, resume_step, wall_before = resolve(options, overrides, checkpoints)
    stored = {} if resume_step is None else checkpoints.meta(resume_step).get("cadence", {})
    options = _cadence(options, stored)
    total = config.total_steps
    end = min(total, options.stop_at) if options.stop_at else total

    problem = build_problem(dataset, config)
    devices = jax.devices()
    if options.devices:
        devices = devices[:options.devices]
    try:
        trainer = Trainer(config, problem.generator, problem.critic, problem.sample_real,
                          mesh=make_mesh(devices))
    except ValueError as err:
        raise RunError(f"--batch-size: {err}") from None
    state = trainer.init()
    if resume_step is not None:
        state = trainer.replicate(checkpoints.state(resume_step, state))
    it = int(host_copy(state.iteration))
    evaluator = _Evaluator(dataset, config, problem, options.eval_samples)
    log = outputs.MetricsLog(out, keep_until=it) if primary else None
    run_meta = {"dataset": dataset, "config": dataclasses.asdict(config),
                "cadence": {k: getattr(options, k) for k in CADENCE}}
    if primary:
        outputs.write_json(out / outputs.RUN, {**run_meta, "devices": len(devices),
                                                "processes": jax.process_count()})

    def wall():
        return wall_before + time.perf_counter() - start

    with RunProgress(total, it, enabled=primary and options.progress) as bar:
        while it < end:
            stop = _next_stop(it, end, options.log_every, options.checkpoint_every,
                              options.eval_every if evaluator.modes is not None else None)
            state, metrics = trainer.run(state, stop - it)
            metrics = jax.device_get(metrics)
            it = stop
            if primary:
                quality = None
                if evaluator.modes is not None and (it % options.eval_every == 0 or it == end):
                    quality = evaluator.quality(host_copy(state.g_params))
                record = outputs.metrics_record(it, wall(), metrics, quality)
                log.append(record)
                bar.update(it, record)
            if it % options.checkpoint_every == 0 or it == end:
                checkpoints.save(it, state, {**run_meta, "wall_s": wall()})
    train_s = wall()
    checkpoints.close()

    summary = {"dataset": dataset, "steps": it, "total_steps": total,
               "devices": len(devices), "processes": jax.process_count()}
    if not primary:
        return summary
    host = host_copy(state)
    samples = evaluator.samples(host.g_params, max(options.eval_samples, 2500))
    outputs.write_samples(out, samples)
    quality = evaluator.quality(host.g_params)
    if quality is not None:
        summary.update(quality)
    summary["train_s"] = round(train_s, 1)
    title = f"{dataset}: {it} generator steps" + (
        f", {quality['modes']}/{quality['total_modes']} modes, {quality['high_quality']:.1f}% "
        f"high quality" if quality else "")
    evaluator.figure(out / outputs.FIGURE, host, log.records, title)
    summary.update(wall_s=round(wall(), 1), out=str(out))
    outputs.write_json(out / outputs.SUMMARY, summary)
    return summary


__all__ = ["DEFAULT_DATASET", "FLAGS", "RunError", "RunOptions", "resolve", "train"]
