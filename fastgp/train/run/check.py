"""``fastgp check``: the sharded trainer must equal the plain one-device trainer, step for step.

    fastgp check --devices 8 --steps 5 --batch-size 64      # one JSON line; exit 1 beyond a bound
    python -m fastgp.train.cli check ARGS                   # the same, without the script

:func:`run_check` builds the same GAN (small GELU MLPs on 8 Gaussians, or the digits recipe's conv
pair with GELU on 8x8 digits, with ``critic="vit"`` the ViT critic of ``--critic vit`` against that
generator) from the same seed as ``fastgp.train.trainers.trainer.Trainer`` on a ``devices``-long
mesh and as ``fastgp.train.trainers.naive_trainer.NaiveTrainer`` on one device. The naive trainer
trains ``steps`` generator iterations; at every one of its steps both trainers start from its state,
so rounding never compounds and every difference is one step's. Reported, each the largest over the
steps:

- every critic step's loss, penalty and score gap (as seen by every core), each core's
  input-gradient norm mean, min and max against the naive norms of that core's slice of the
  global batch, and the critic's parameter gradients; every generator step's loss and
  gradients (``critic_loss`` ... ``generator_grads``);
- each iteration run by the trainer's own loop (``Trainer.run``, fused or not) from the naive
  state that began it: its losses (``run_values``) and its parameter updates (``run_updates``).

In float32 every difference is taken against the quantity's own float32 error scale S, derived
from the computation at the naive state of its step (``fastgp.train.run.check_bounds``: the size of
what the batch mean adds up, which does not cancel when the quantity does, and the size of one
sample's own rounding), and the check fails where ``|a - b| > EPSILON * S``: gradients per array,
the run's parameter updates entry by entry against the drift Adam can make of the gradients'
rounding. The bound depends on the computation only, not on the mesh, the batch split or the CPU,
and sits several times below the smallest planted bug (every gradient scaled by 1.0001).
The networks use GELU, curved everywhere: with piecewise-linear activations a bias gradient that is
exactly zero is rounding noise in float32, which Adam turns into steps of random sign. In bfloat16
a difference is relative to the reference (``max|a - b| / max|b|`` per array,
:func:`max_rel_diff`; the updates ``|a - b|_2 / |b|_2``, :func:`rel_l2_diff`, reported, not
gated), at BF16_TOLERANCES.
"""

import dataclasses
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np

from fastgp.options import Backend, SecondOrder
from fastgp.train.config import CriticName, Precision, TrainConfig, TrainKind
from fastgp.train.data.sets import CHECK_DATASETS, load_digits, sample_toy
from fastgp.train.models.networks import Model, conv_critic, conv_generator, mlp, vit_critic
from fastgp.train.objective.losses import Loss
from fastgp.train.objective.penalties import Placement
from fastgp.train.recipes.defaults import DIGITS, VIT, recipe
from fastgp.train.run.check_bounds import EPSILON, Bounds, scaled_difference
from fastgp.train.trainers.naive_trainer import NaiveTrainer
from fastgp.train.trainers.state import index_sampler
from fastgp.train.trainers.trainer import Trainer, make_mesh

# bfloat16: each difference relative to the reference's size, at a few of bfloat16's roundoffs
# (2^-8); its networks round every layer to 8 bits, which the float32 error model of
# fastgp.train.run.check_bounds does not describe. The parameter updates are reported, not gated.
BF16_TOLERANCES: dict[str, float | None] = {
    "critic_grads": 5e-2,
    "generator_grads": 5e-2,
    "values": 5e-2,
    "run_values": 5e-2,
    "run_updates": None,
}


def _paired_arrays(ours: Any, ref: Any) -> list[tuple[np.ndarray, np.ndarray, bool]]:
    """[(a, b, per_core)]: the float64 arrays of two pytrees, leaf by leaf; where ``a`` carries a
    trailing device axis that ``b`` lacks (``per_core``), ``b`` gains a length-1 one to match."""
    ours_leaves, ref_leaves = jax.tree.leaves(ours), jax.tree.leaves(ref)
    if len(ours_leaves) != len(ref_leaves):
        raise ValueError(f"pytrees differ: {len(ours_leaves)} vs {len(ref_leaves)} leaves")
    pairs = []
    for a, b in zip(ours_leaves, ref_leaves, strict=True):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        per_core = a.ndim == b.ndim + 1
        pairs.append((a, b[..., None] if per_core else b, per_core))
    return pairs


def max_rel_diff(ours: Any, ref: Any) -> float:
    """Largest relative difference between two pytrees of arrays (ours may carry a trailing device
    axis that ref lacks: every core is compared). NaN in both at the same place counts as equal."""
    pairs = _paired_arrays(ours, ref)
    scale = max((float(np.nanmax(np.abs(b), initial=0.0)) for _, b, _ in pairs), default=0.0)
    worst = 0.0
    for a, b, _ in pairs:
        diff = np.abs(a - b)
        diff = np.where(np.isnan(a) & np.isnan(b), 0.0, diff)
        diff = np.where(np.isnan(diff), np.inf, diff)
        denom = max(float(np.nanmax(np.abs(b), initial=0.0)), 1e-6 * scale, 1e-30)
        worst = max(worst, float(np.max(diff, initial=0.0)) / denom)
    return worst


def rel_l2_diff(ours: Any, ref: Any) -> float:
    """Largest ``|a - b|_2 / |b|_2`` over the arrays of two pytrees (ours may carry a trailing
    device axis: every core is compared); an all-zero reference array counts by ``|a|_2``."""
    worst = 0.0
    for a, b, per_core in _paired_arrays(ours, ref):
        size = float(np.sqrt(np.sum(b**2)))
        diff = np.sqrt(np.sum((a - b) ** 2, axis=tuple(range(a.ndim - 1)) if per_core else None))
        if not np.all(np.isfinite(diff)):
            return float("inf")
        worst = max(worst, float(np.max(diff)) / (size if size > 0 else 1.0))
    return worst


def _shard_norm_stats(norms: np.ndarray, devices: int) -> dict[str, np.ndarray]:
    """(..., B) naive norms -> per-core mean/min/max (..., N), the trainer's layout."""
    split = norms.reshape(norms.shape[:-1] + (devices, -1))
    return {"norm_mean": split.mean(-1), "norm_min": split.min(-1), "norm_max": split.max(-1)}


def toy_problem(config: TrainConfig) -> tuple[Model, Model, Callable[..., Any]]:
    """(generator, critic, sample_real) of the check: small GELU MLPs on 8 Gaussians."""
    generator = mlp([config.latent_dim, 32, 32, 2], "gelu")
    critic = mlp([2, 32, 32, 1], "gelu")
    return generator, critic, lambda key, n: sample_toy("8gaussians", key, n)


def digits_problem(config: TrainConfig) -> tuple[Model, Model, Callable[..., Any]]:
    """(generator, critic, sample_real) of the conv check: the digits recipe's NHWC conv pair
    (``fastgp.train.recipes.defaults``) with GELU, on sklearn's 8x8 digits (B, 8, 8, 1); with
    ``config.critic == "vit"`` the critic is the recipe's ViT (``defaults.VIT``; GELU already)."""
    critic = (
        vit_critic(**VIT._asdict()) if config.critic == "vit" else conv_critic(DIGITS.width, "gelu")
    )
    return (
        conv_generator(config.latent_dim, DIGITS.width, "gelu"),
        critic,
        index_sampler(load_digits()),
    )


class _Side(NamedTuple):
    """One path's records of the check, step by step from the naive trainer's states."""

    critic: list[dict[str, Any]]  # per critic step: its metrics
    critic_grads: list[Any]  # per critic step: its gradients
    generator_loss: list[Any]  # per generator step
    generator_grads: list[Any]
    run: list[dict[str, Any]]  # per iteration: the metrics of one run() of it
    updates: list[Any]  # per iteration: (generator, critic) parameter updates of that run


def run_check(
    devices: int,
    steps: int,
    batch_size: int,
    *,
    backend: Backend | None = None,
    n_critic: int = 5,
    gp_kind: TrainKind = "wgan-gp",
    gp_every: int = 1,
    precision: Precision = "f32",
    lr: float = 1e-3,
    seed: int = 0,
    second_order: SecondOrder = "reverse-over-forward",
    dataset: str = "8gaussians",
    critic: CriticName = "conv",
    loss: Loss = "wasserstein",
    gp_at: Placement | None = None,
) -> dict[str, Any]:
    """Check ``steps`` generator iterations both ways; a JSON-ready dict with ``ok`` the verdict.

    These keyword arguments and their defaults are ``fastgp check``'s options (``fastgp.train.cli``
    reads them from this signature). ``backend=None`` runs the Pallas kernel: "tpu-interpret" on
    CPU, "pallas" on TPU and GPU (the default "auto" is XLA everywhere, so the check forces the
    kernel to exercise it); "xla" in a job of several processes, where interpret mode cannot run.
    ``dataset``: "8gaussians" (GELU MLPs) or "digits" (conv networks, with ``critic="vit"`` the
    ViT critic). Raises ValueError for an unknown dataset or critic, or too few visible devices.
    """
    available = _visible_devices(devices, dataset, critic)
    config = _check_config(dataset, **{k: v for k, v in locals().items() if k in _CONFIG_ARGS})
    problem = toy_problem(config) if dataset == "8gaussians" else digits_problem(config)
    sharded = Trainer(config, *problem, mesh=make_mesh(available[:devices]))
    naive = NaiveTrainer(config, *problem)
    start = time.perf_counter()
    scales = Bounds(naive, devices) if precision == "f32" else None
    ours, ref = _step_by_step(sharded, naive, steps, scales)
    diffs = _differences(ours, ref, devices, scales)
    bounds = _bounds(precision, diffs)
    return {
        "ok": _within(diffs, bounds, ours, ref, measured=gp_kind != "approximate-r1"),
        "max_rel_diff": diffs,
        "tolerance": bounds,
        "mesh": _mesh_record(sharded, available[0].platform),
        "config": dataclasses.asdict(config),
        "dataset": dataset,
        "steps": steps,
        "processes": jax.process_count(),
        "nonfinite_norms": int(sum(np.sum(m["nonfinite"]) for m in ours.critic)),
        "seconds": round(time.perf_counter() - start, 3),  # both paths, compilation included
    }


def _visible_devices(devices: int, dataset: str, critic: str = "conv") -> list[Any]:
    """``jax.devices()``; ValueError for a ``dataset`` the check does not know or a ``critic`` it
    cannot take, or (saying how to get more on CPU) when fewer than ``devices`` are visible."""
    if dataset not in CHECK_DATASETS:
        raise ValueError(f"unknown check dataset {dataset!r}; valid: {', '.join(CHECK_DATASETS)}")
    recipe(dataset, critic)  # ValueError: the ViT takes images
    available = jax.devices()
    if devices > len(available):
        raise ValueError(
            f"the check needs {devices} devices but only {len(available)} are "
            f"visible; on CPU set XLA_FLAGS=--xla_force_host_platform_device_count="
            f"{devices} before JAX starts (fastgp check --devices {devices} does this)"
        )
    return available


def _mesh_record(sharded: Trainer, platform: str) -> dict[str, Any]:
    """The report's description of the sharded trainer's mesh."""
    return {
        "axis_names": list(sharded.mesh.axis_names),
        "shape": [sharded.devices],
        "platform": platform,
        "devices": [str(d) for d in sharded.mesh.devices.flat],
    }


def _check_backend(backend: Backend | None) -> Backend:
    """``backend``, or for None the kernel's: "xla" across processes (interpret mode runs in one
    only), else "tpu-interpret" on CPU and "pallas" on TPU and GPU."""
    if backend is None and jax.process_count() > 1:
        return "xla"
    if backend is None:
        return "tpu-interpret" if jax.default_backend() == "cpu" else "pallas"
    return backend


def _step_by_step(
    sharded: Trainer, naive: NaiveTrainer, iterations: int, scales: Bounds | None = None
) -> tuple[_Side, _Side]:
    """Both trainers fed the naive trainer's state at every step, so that rounding cannot
    compound: each critic and generator step's metrics and gradients, and each iteration's
    ``run`` (the trainer's own loop, from the state the naive one began the iteration with);
    ``scales`` records every step's error scales."""
    ours, ref = (_Side([], [], [], [], [], []) for _ in range(2))
    state = naive.init()
    for _ in range(iterations):
        begin = state
        critic_steps = []
        for step in range(naive.config.n_critic):
            metrics, grads = sharded.critic_gradients(sharded.replicate(state), np.int32(step))
            _append(ours, critic=metrics, critic_grads=grads)
            before = state
            state, metrics, grads = naive.critic_update(state, step)
            _append(ref, critic=metrics, critic_grads=grads)
            critic_steps.append(metrics)
            if scales is not None:
                scales.critic_step(before, step, grads, state)
        loss, grads = sharded.generator_gradients(sharded.replicate(state))
        _append(ours, generator_loss=loss, generator_grads=grads)
        before = state
        state, loss, grads = naive.generator_update(state)
        _append(ref, generator_loss=loss, generator_grads=grads)
        if scales is not None:
            scales.generator_step(before, grads, state)
        after, metrics = sharded.run(sharded.replicate(begin), 1)
        _append(ours, run=metrics, updates=_updates(after, begin))
        iteration = {
            k: np.stack([np.asarray(m[k]) for m in critic_steps])[None] for k in critic_steps[0]
        }
        _append(
            ref,
            run={**iteration, "generator_loss": np.asarray(loss)[None]},
            updates=_updates(state, begin),
        )
    return jax.device_get(ours), jax.device_get(ref)


def _append(side: _Side, **records: Any) -> None:
    for name, record in records.items():
        getattr(side, name).append(record)


def _updates(after: Any, before: Any) -> Any:
    """(generator, critic) parameter updates: float64 arrays, after minus before."""
    return jax.tree.map(
        lambda a, b: np.asarray(a, np.float64) - np.asarray(b, np.float64),
        (after.g_params, after.d_params),
        (before.g_params, before.d_params),
    )


def _worst(pairs: Any, diff: Callable[[Any, Any], float] = max_rel_diff) -> float:
    """The largest ``diff`` over (ours, ref) pairs of steps."""
    return max(diff(a, b) for a, b in pairs)


_LOSSES = ("critic_loss", "penalty", "wasserstein", "generator_loss")


def _differences(ours: _Side, ref: _Side, devices: int, scales: Bounds | None) -> dict[str, float]:
    """Each reported quantity's largest difference over the steps, sharded (``ours``) vs naive
    (``ref``), every step taken from the same state: the critic steps' losses, the per-core norm
    statistics and the gradients, and each iteration's ``run``: its losses and its parameter
    updates. Float32 (``scales``): |a - b| over its error scale S, gradients per array, the
    updates per entry (``fastgp.train.run.check_bounds``); bfloat16: relative to the reference
    (:func:`max_rel_diff`, the updates by :func:`rel_l2_diff`)."""
    critic = list(zip(ours.critic, ref.critic, strict=True))
    norms = [
        (
            {k: a[k] for k in ("norm_mean", "norm_min", "norm_max")},
            _shard_norm_stats(np.asarray(b["norms"]), devices),
        )
        for a, b in critic
    ]
    run = [
        ({k: a[k] for k in _LOSSES}, {k: b[k] for k in _LOSSES})
        for a, b in zip(ours.run, ref.run, strict=True)
    ]
    pairs = {
        **{name: [(a[name], b[name]) for a, b in critic] for name in _LOSSES[:3]},
        "generator_loss": list(zip(ours.generator_loss, ref.generator_loss, strict=True)),
        "norm_stats": norms,
        "critic_grads": list(zip(ours.critic_grads, ref.critic_grads, strict=True)),
        "generator_grads": list(zip(ours.generator_grads, ref.generator_grads, strict=True)),
        "run_values": run,
        "run_updates": list(zip(ours.updates, ref.updates, strict=True)),
    }
    if scales is None:
        diffs = {name: _worst(p) for name, p in pairs.items() if name != "run_updates"}
        return {**diffs, "run_updates": _worst(pairs["run_updates"], rel_l2_diff)}
    step_scales = {
        **{name: [s[name] for s in scales.critic] for name in (*_LOSSES[:3], "critic_grads")},
        "norm_stats": [s["norm_stats"] for s in scales.critic],
        **{
            name: [s[name] for s in scales.generator]
            for name in ("generator_loss", "generator_grads")
        },
        "run_values": scales.run,
        "run_updates": scales.updates,
    }
    return {
        name: max(
            scaled_difference(
                a, b, s, per_entry=name in ("norm_stats", "run_values", "run_updates")
            )
            for (a, b), s in zip(pairs[name], step_scales[name], strict=True)
        )
        for name in pairs
    }


# run_check's arguments that are TrainConfig fields or map onto them.
_CONFIG_ARGS = (
    "batch_size",
    "n_critic",
    "gp_kind",
    "gp_every",
    "precision",
    "backend",
    "lr",
    "seed",
    "second_order",
    "critic",
    "loss",
    "gp_at",
)


def _check_config(
    dataset: str, *, backend: Backend | None, lr: float, **fields: Any
) -> TrainConfig:
    """The check's TrainConfig: ``lr`` for both networks, the kernel's backend for None
    (:func:`_check_backend`), the digits recipe's latent size on digits."""
    latent = {"latent_dim": DIGITS.fields["latent_dim"]} if dataset == "digits" else {}
    return TrainConfig(backend=_check_backend(backend), lr_g=lr, lr_d=lr, **latent, **fields)


def _bounds(precision: Precision, diffs: dict[str, float]) -> dict[str, float | None]:
    """Each difference's bound: float32's EPSILON (|a - b| <= EPSILON * S), bfloat16's its
    group's in BF16_TOLERANCES (None: reported, not gated)."""
    if precision == "f32":
        return dict.fromkeys(diffs, EPSILON)
    groups = {"critic_grads": "critic_grads", "generator_grads": "generator_grads"}
    groups |= {"run_values": "run_values", "run_updates": "run_updates"}
    return {k: BF16_TOLERANCES[groups.get(k, "values")] for k in diffs}


def _within(
    diffs: dict[str, float],
    bounds: dict[str, float | None],
    ours: _Side,
    ref: _Side,
    *,
    measured: bool,
) -> bool:
    """The verdict: every gated difference within its bound, and at every critic step and in
    every run the same penalty steps and (where norms are ``measured``) the same non-finite norm
    counts as the naive trainer."""

    def ref_nonfinite(m: dict[str, Any]) -> np.ndarray:
        if not measured:  # the approximate penalty takes no input-gradient: NaN, not counted
            return np.zeros(np.shape(m["gp_applied"]), int)
        return np.sum(~np.isfinite(np.asarray(m["norms"])), -1) * np.asarray(m["gp_applied"])

    same_steps = all(
        np.array_equal(a["gp_applied"], b["gp_applied"])
        and np.array_equal(np.sum(a["nonfinite"], -1), ref_nonfinite(b))
        for a, b in [
            *zip(ours.critic, ref.critic, strict=True),
            *zip(ours.run, ref.run, strict=True),
        ]
    )
    return same_steps and all(bound is None or diffs[k] <= bound for k, bound in bounds.items())
