"""Self-check: the sharded trainer must equal the plain one-device trainer, step for step.

    python -m fastgp.train.selfcheck --devices 8 --steps 5 --batch-size 64  # JSON; exit 1 if off
    python -m fastgp.train.selfcheck --dataset digits --devices 2 --batch-size 32  # conv critic

:func:`run_check` trains the same WGAN-GP (small MLPs on 8 Gaussians, or the digits recipe's conv
pair on 8x8 digits) from the same seed with ``fastgp.train.trainer.Trainer`` on a
``devices``-long mesh and with ``fastgp.train.naive_trainer.NaiveTrainer`` on one device, and
reports the largest relative differences of: every step's critic loss, penalty,
Wasserstein estimate and generator loss (as seen by every core); each core's input-gradient norm
mean/min/max against the same statistics of the naive per-sample norms on that core's slice of the
global batch; the first critic and generator gradients; the parameters and the parameter updates
(params_K - params_0) after K generator iterations.

A relative difference is ``max|a - b| / max|b|`` per array (the floor ``1e-6 * max|b|`` over the
pytree keeps exactly-zero reference leaves, such as the critic's output bias gradient, finite),
except for the parameter updates: ``|a - b|_2 / |b|_2`` per array (:func:`rel_l2_diff`). Adam
divides each entry by its own size, so an entry whose gradient is small against its array's
largest turns that gradient's rounding error, large relative to itself, into a difference in an
lr-sized step; the largest entry-wise difference then measures the smallest gradient entry, not
the sharding. Measured on the digits pair (2 devices, 2 iterations of 2 critic steps, batch 32):
one entry of the generator's 32x1024 projection moved by 1.9e-3 of the array's largest update,
while the array's L2 difference is 1.5e-5 and its gradients agree to 8e-7.

The check's networks use GELU (the recipes' use ReLU and LeakyReLU), which is curved everywhere.
With piecewise-linear activations a hidden unit that stays in one linear piece over the whole
batch has a bias gradient that is exactly zero in exact arithmetic (its Wasserstein terms cancel
and the input-gradient does not depend on it); in float32 it is rounding noise, which Adam's
normalisation turns into +-lr steps of random sign, so the two paths would disagree on that
parameter for a reason unrelated to sharding.

Tolerances, float32: the two paths do the same arithmetic except for the order of reductions
(per-core partial sums then psum, versus one sum over the global batch) and the kernel's blocked
sums of squares: a few ulps (1e-7 relative) per reduction. Measured over 1, 2, 3, 8 devices and
three seeds: losses, norms and first gradients <= 3e-6, parameter updates after 5 iterations
<= 2e-5 entry-wise (that floor is one ulp of a parameter of size ~0.1-1 against an update of
~5e-3 with lr 1e-3); 6e-7 in L2 on 2 devices. Thresholds: 1e-5 for first gradients, 1e-4
for values after updates, which still sit orders of magnitude below any scaling bug (a factor
of 2 or n_devices is a difference >= 0.5).
Digits: the penalty sees (B_local, 8, 8, 1) input-gradients; a per-core batch above 128 (e.g.
192) splits the kernel's grid into two batch blocks, the last ragged (``kernels.tiling``).
Measured on 2 devices, 2 iterations of 2 critic steps, global batch 32, float32: within the
float32 bounds (parameter updates 1.5e-5 in L2; entry-wise, 3e-5 with the generator before
and, with ReLU/LeakyReLU, 1e-4 to 2e-4). At a per-core batch of 192 the conv gradients'
summation order alone moved float32 parameter updates by 1e-4 to 6e-4 entry-wise (Adam divides
each entry by its own size), so that shape is checked in bfloat16.

bfloat16: both paths compute in bfloat16 (the penalty's points too, so the input-gradients the
kernel reads are bfloat16), where the order of the batch sums in the weight gradients alone moves
values by ~1e-2; losses, norms, gradients and parameters must agree to 5e-2 ("close-ish", still
catching any scaling bug). Parameter updates are reported but not gated in bfloat16: gradient
entries near zero carry ~100% rounding error that Adam turns into +-lr steps.
"""

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time

import jax
import numpy as np

from fastgp.train.data import CHECK_DATASETS, load_digits, sample_toy
from fastgp.train.models import conv_critic, conv_generator, mlp
from fastgp.train.naive_trainer import NaiveTrainer
from fastgp.train.recipes import DIGITS
from fastgp.train.state import TrainConfig, index_sampler
from fastgp.train.trainer import Trainer, make_mesh

# Per precision: the bound for each reported difference (None: reported, not gated).
# bf16 gates the gradients, not the parameters after Adam: Adam's first update of an entry is
# about lr * sign(g), so a gradient entry near 0 whose sign bf16 rounding flips moves it by 2 lr,
# the whole scale of a zero-initialised bias.
TOLERANCES = {
    "f32": {"critic_grads": 1e-5, "generator_grads": 1e-5, "values": 1e-4, "param_updates": 1e-4},
    "bf16": {
        "critic_grads": 5e-2,
        "generator_grads": 5e-2,
        "values": 5e-2,
        "params": None,
        "param_updates": None,
    },
}


def _paired_arrays(ours, ref) -> list:
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


def max_rel_diff(ours, ref) -> float:
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


def rel_l2_diff(ours, ref) -> float:
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


def _shard_norm_stats(norms, devices: int):
    """(I, C, B) naive norms -> per-core mean/min/max (I, C, N), the trainer's layout."""
    split = norms.reshape(norms.shape[:2] + (devices, -1))
    return {"norm_mean": split.mean(-1), "norm_min": split.min(-1), "norm_max": split.max(-1)}


def toy_problem(config: TrainConfig):
    """(generator, critic, sample_real) of the check: small GELU MLPs on 8 Gaussians."""
    generator = mlp([config.latent_dim, 32, 32, 2], "gelu")
    critic = mlp([2, 32, 32, 1], "gelu")
    return generator, critic, lambda key, n: sample_toy("8gaussians", key, n)


def digits_problem(config: TrainConfig):
    """(generator, critic, sample_real) of the conv check: the digits recipe's NHWC conv pair
    (``fastgp.train.recipes``) with GELU, on sklearn's 8x8 digits (B, 8, 8, 1)."""
    return (
        conv_generator(config.latent_dim, DIGITS.width, "gelu"),
        conv_critic(DIGITS.width, "gelu"),
        index_sampler(load_digits()),
    )


def run_check(
    devices: int,
    steps: int,
    batch_size: int,
    *,
    backend=None,
    n_critic: int = 5,
    gp_kind: str = "wgan-gp",
    gp_every: int = 1,
    precision: str = "f32",
    lr: float = 1e-3,
    seed: int = 0,
    second_order: str = "reverse-over-forward",
    dataset: str = "8gaussians",
) -> dict:
    """Train ``steps`` generator iterations both ways; a JSON-ready dict with ``ok`` the verdict.

    ``backend=None`` runs the Pallas kernel: "tpu-interpret" on CPU, "pallas" on TPU and GPU
    (the default "auto" is XLA everywhere, so the check forces the kernel to exercise it).
    ``dataset``: "8gaussians" (GELU MLPs) or "digits" (conv critic and generator).
    """
    if dataset not in CHECK_DATASETS:
        raise ValueError(f"unknown check dataset {dataset!r}; valid: {', '.join(CHECK_DATASETS)}")
    available = jax.devices()
    if devices > len(available):
        raise ValueError(
            f"the check needs {devices} devices but only {len(available)} are "
            f"visible; on CPU set XLA_FLAGS=--xla_force_host_platform_device_count="
            f"{devices} before JAX starts (python -m fastgp.train.selfcheck does "
            f"this)"
        )
    if backend is None:
        backend = "tpu-interpret" if jax.default_backend() == "cpu" else "pallas"
    latent = {"latent_dim": DIGITS.fields["latent_dim"]} if dataset == "digits" else {}
    config = TrainConfig(
        batch_size=batch_size,
        n_critic=n_critic,
        gp_kind=gp_kind,
        gp_every=gp_every,
        precision=precision,
        backend=backend,
        lr_g=lr,
        lr_d=lr,
        seed=seed,
        second_order=second_order,
        **latent,
    )
    problem = toy_problem(config) if dataset == "8gaussians" else digits_problem(config)
    sharded = Trainer(config, *problem, mesh=make_mesh(available[:devices]))
    naive = NaiveTrainer(config, *problem)

    start = time.perf_counter()
    state0 = sharded.init()
    grads = sharded.gradients(state0)
    state, metrics = jax.block_until_ready(sharded.run(state0, steps))
    sharded_seconds = time.perf_counter() - start
    start = time.perf_counter()
    ref0 = naive.init()
    ref_grads = naive.gradients(ref0)
    ref, ref_metrics = naive.run(ref0, steps)
    naive_seconds = time.perf_counter() - start

    def updates(s, s0):
        return jax.tree.map(
            lambda a, b: np.asarray(a) - np.asarray(b),
            (s.g_params, s.d_params),
            (s0.g_params, s0.d_params),
        )

    diffs = {
        name: max_rel_diff(metrics[name], ref_metrics[name])
        for name in ("critic_loss", "penalty", "wasserstein", "generator_loss")
    }
    diffs["norm_stats"] = max_rel_diff(
        {k: metrics[k] for k in ("norm_mean", "norm_min", "norm_max")},
        _shard_norm_stats(ref_metrics["norms"], devices),
    )
    diffs["critic_grads"] = max_rel_diff(grads[0], ref_grads[0])
    diffs["generator_grads"] = max_rel_diff(grads[1], ref_grads[1])
    diffs["params"] = max_rel_diff((state.g_params, state.d_params), (ref.g_params, ref.d_params))
    diffs["param_updates"] = rel_l2_diff(updates(state, state0), updates(ref, ref0))

    ref_nonfinite = np.sum(~np.isfinite(ref_metrics["norms"]), -1) * ref_metrics["gp_applied"]
    tol = TOLERANCES[precision]
    bounds = {k: tol.get(k, tol["values"]) for k in diffs}
    ok = (
        all(bounds[k] is None or diffs[k] <= bounds[k] for k in diffs)
        and bool(np.array_equal(np.sum(metrics["nonfinite"], -1), ref_nonfinite))
        and bool(np.array_equal(metrics["gp_applied"], ref_metrics["gp_applied"]))
    )
    return {
        "ok": ok,
        "max_rel_diff": diffs,
        "tolerance": bounds,
        "mesh": {
            "axis_names": list(sharded.mesh.axis_names),
            "shape": [devices],
            "platform": available[0].platform,
            "devices": [str(d) for d in sharded.mesh.devices.flat],
        },
        "config": dataclasses.asdict(config),
        "dataset": dataset,
        "steps": steps,
        "nonfinite_norms": int(np.sum(metrics["nonfinite"])),
        # wall time of each path, compilation included
        "seconds": {"sharded": round(sharded_seconds, 3), "naive": round(naive_seconds, 3)},
    }


def _parser():
    p = argparse.ArgumentParser(
        prog="python -m fastgp.train.selfcheck", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--dataset",
        default=CHECK_DATASETS[0],
        choices=CHECK_DATASETS,
        help="8gaussians (small GELU MLPs) or digits (the conv critic and generator)",
    )
    p.add_argument("--devices", type=int, default=8, help="mesh size (CPU devices are simulated)")
    p.add_argument("--steps", type=int, default=5, help="generator iterations K")
    p.add_argument("--batch-size", type=int, default=64, help="GLOBAL batch size")
    p.add_argument("--n-critic", type=int, default=5)
    p.add_argument("--gp-kind", default="wgan-gp")
    p.add_argument("--gp-every", type=int, default=1)
    p.add_argument("--precision", default="f32")
    p.add_argument(
        "--backend",
        default=None,
        help="penalty backend (default: the kernel; tpu-interpret on CPU)",
    )
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate of both networks")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--second-order",
        default="reverse",
        help="penalty differentiation in the sharded trainer: reverse or forward",
    )
    return p


_FORCE_FLAG = "--xla_force_host_platform_device_count"


def _request_cpu_devices(n: int) -> bool:
    """Ask for ``n`` simulated CPU devices; False if JAX already started with fewer devices."""
    try:
        jax.config.update("jax_num_cpu_devices", n)
    except RuntimeError:  # JAX has already created its backends in this process
        pass
    return len(jax.devices()) >= n


def _rerun_with_devices(n: int, argv) -> int:
    """Run the check in a fresh interpreter that has ``n`` CPU devices; its exit code."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {_FORCE_FLAG}={n}".strip()
    env["JAX_PLATFORMS"] = "cpu"
    return subprocess.run(
        [sys.executable, "-m", "fastgp.train.selfcheck", *argv], env=env
    ).returncode


def main(argv=None) -> int:
    """Parse ``argv``, run :func:`run_check`, print one JSON line; 0 within tolerance, else 1."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parser().parse_args(argv)
    if args.devices < 1:
        raise SystemExit(f"--devices must be >= 1, got {args.devices}")
    if not _request_cpu_devices(args.devices):
        if jax.default_backend() != "cpu" or _FORCE_FLAG in os.environ.get("XLA_FLAGS", ""):
            raise SystemExit(
                f"--devices {args.devices} requested but only "
                f"{len(jax.devices())} {jax.default_backend()} devices are visible"
            )
        return _rerun_with_devices(args.devices, argv)
    result = run_check(
        args.devices,
        args.steps,
        args.batch_size,
        backend=args.backend,
        n_critic=args.n_critic,
        gp_kind=args.gp_kind,
        gp_every=args.gp_every,
        precision=args.precision,
        lr=args.lr,
        seed=args.seed,
        second_order=args.second_order,
        dataset=args.dataset,
    )
    print(json.dumps(result), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
