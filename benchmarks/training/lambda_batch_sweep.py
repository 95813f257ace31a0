"""The penalty weight against the global batch: quality, penalty and norms on a lambda x batch grid.

    JAX_PLATFORMS=cpu python -m benchmarks.training.lambda_batch_sweep [--steps 1500] [--devices 8]
    -> benchmarks/results/training/lambda_batch.{md,json,png}

Each cell trains the 8-Gaussians toy recipe (``fastgp.train.recipes.defaults.TOY``: 3x128 MLPs, 5
critic steps, the penalty on every one) on 25 Gaussians by default with the sharded trainer on
``--devices`` simulated CPU devices, global batch B, for ``--steps`` generator iterations (both
learning rates decaying over the last half; the iterations fused in one ``lax.scan``, which XLA:CPU
runs as fast as written-out steps for these MLPs), then scores 2500 samples (modes captured, % high
quality) and averages the critic's last tenth of steps: the penalty term, the mean per-sample
penalty (penalty / effective weight) and the input-gradient norms.

Two reductions of the per-sample penalties p_b over the global batch:

``mean``  lambda * mean_b p_b: what ``fastgp.gradient_penalty`` computes on any mesh.
``sum``   lambda * sum_b p_b: the common bug. It is exactly the mean with weight lambda * B
          (same value, same gradients), so it runs as such: the grid shows what the bug's
          batch scaling does to training.
"""

import json
import math
import os
import sys
import time

if "--devices" in sys.argv:  # before JAX starts: simulated CPU devices
    _n = sys.argv[sys.argv.index("--devices") + 1]
    os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={_n}")
else:
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax
import numpy as np

import benchmarks
from benchmarks import harness
from benchmarks.tables import markdown_table
from fastgp.train.config import TrainConfig
from fastgp.train.data.quality import mode_quality
from fastgp.train.data.sets import sample_toy, toy_modes
from fastgp.train.recipes.defaults import TOY, toy_networks
from fastgp.train.trainers.trainer import Trainer, make_mesh

RESULTS = benchmarks.RESULTS / "training"
REDUCTIONS = ("mean", "sum")


def effective_weight(reduction: str, weight: float, batch: int) -> float:
    """The mean-reduced weight that reproduces ``reduction`` of per-sample penalties exactly."""
    return weight * batch if reduction == "sum" else weight


def train_cell(dataset, reduction, weight, batch, steps, devices, seed):
    """One run; a JSON-ready dict of its quality and late-training penalty and norm statistics."""
    lam = effective_weight(reduction, weight, batch)
    config = TrainConfig(
        **{**TOY.fields, "batch_size": batch, "gp_weight": lam},
        total_steps=steps,
        seed=seed,
        backend="xla",
    )
    generator, critic = toy_networks(config.latent_dim, TOY.width)
    trainer = Trainer(
        config,
        generator,
        critic,
        lambda key, n: sample_toy(dataset, key, n),
        mesh=make_mesh(jax.devices()[:devices]),
        fused=True,
    )
    start = time.perf_counter()
    state = trainer.init()
    tenth = steps // 10  # ten equal chunks: one compiled program
    for _ in range(10):
        state, metrics = trainer.run(state, tenth)
    samples = np.asarray(trainer.sample(state, jax.random.PRNGKey(10_000 + seed), 2500))
    wall = time.perf_counter() - start
    critic = {k: np.asarray(v) for k, v in metrics.items() if k != "generator_loss"}
    finite = bool(np.all(np.isfinite(samples)) and np.all(np.isfinite(critic["critic_loss"])))
    quality = (
        mode_quality(samples, *toy_modes(dataset))
        if finite
        else {"modes": 0, "total_modes": len(toy_modes(dataset)[0]), "high_quality": 0.0}
    )
    penalty = float(np.mean(critic["penalty"][..., 0]))
    return {
        "reduction": reduction,
        "weight": weight,
        "batch": batch,
        "effective_weight": lam,
        "finite": finite,
        "modes": int(quality["modes"]),
        "total_modes": int(quality["total_modes"]),
        "high_quality": float(quality["high_quality"]),
        "penalty": penalty,
        "mean_sample_penalty": penalty / lam,
        "wasserstein": float(np.mean(critic["wasserstein"][..., 0])),
        "norm_mean": float(np.mean(critic["norm_mean"])),
        "norm_min": float(np.min(critic["norm_min"])),
        "norm_max": float(np.max(critic["norm_max"])),
        "wall_s": round(wall, 1),
    }


def _fmt(x):
    return "nan" if not math.isfinite(x) else (f"{x:.3g}" if abs(x) < 1e4 else f"{x:.2e}")


def write_table(cells, args, path):
    lines = [
        (
            f"# Penalty weight x global batch ({args.dataset}, {args.steps} generator steps, "
            f"{args.devices} simulated devices, seed {args.seed})"
        ),
        "",
        "`python -m benchmarks.training.lambda_batch_sweep " + " ".join(sys.argv[1:]) + "`. "
        "Quality on 2500 samples; penalty and norms averaged over the critic's last tenth of "
        "steps. `sum` runs as the mean with weight lambda x B (identical value and gradients).",
        "",
    ]
    rows = [
        [
            c["reduction"],
            f"{c['weight']:g}",
            c["batch"],
            f"{c['effective_weight']:g}",
            f"{c['modes']}/{c['total_modes']}",
            f"{c['high_quality']:.1f} %",
            *(
                _fmt(c[key])
                for key in (
                    "penalty",
                    "mean_sample_penalty",
                    "norm_mean",
                    "norm_min",
                    "norm_max",
                    "wasserstein",
                )
            ),
            f"{c['wall_s']:.0f}",
        ]
        for c in cells
    ]
    head = [
        "reduction",
        "lambda",
        "batch",
        "effective lambda",
        "modes",
        "high quality",
        "penalty term",
        "mean (n - 1)^2",
        "norm mean",
        "norm min",
        "norm max",
        "W estimate",
        "wall s",
    ]
    lines += markdown_table(head, rows)
    path.write_text("\n".join(lines) + "\n")


def _annotate(ax, by_key, weights, batches, annotate):
    """Each measured cell's text on its square, and the lambda and batch ticks."""
    for i, w in enumerate(weights):
        for j, b in enumerate(batches):
            if (w, b) in by_key:
                ax.text(
                    j,
                    i,
                    annotate(by_key[(w, b)]),
                    ha="center",
                    va="center",
                    fontsize=8,
                    bbox=dict(facecolor="white", alpha=0.7, lw=0),
                )
    ax.set_xticks(range(len(batches)), [str(b) for b in batches])
    ax.set_yticks(range(len(weights)), [f"{w:g}" for w in weights])
    ax.set_xlabel("global batch B")
    ax.set_ylabel("lambda")


def write_heatmap(cells, args, path):
    """Per reduction, lambda x batch: modes captured (annotated with % high quality) and the mean
    per-sample penalty (n - 1)^2 (log colour, annotated with the mean norm)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    weights, batches = sorted({c["weight"] for c in cells}), sorted({c["batch"] for c in cells})
    reductions = [r for r in REDUCTIONS if any(c["reduction"] == r for c in cells)]
    total = max(c["total_modes"] for c in cells)
    fig, axes = plt.subplots(
        2, len(reductions), figsize=(4.6 * len(reductions), 7.2), squeeze=False
    )
    panels = (
        (
            "modes",
            "modes captured (and % high quality)",
            "viridis",
            (0, total),
            lambda c: f"{c['modes']}/{c['total_modes']}\n{c['high_quality']:.0f}%",
        ),
        (
            "mean_sample_penalty",
            "log10 mean (n-1)^2 (and mean norm n)",
            "magma_r",
            (-4, 0),
            lambda c: f"{_fmt(c['mean_sample_penalty'])}\nn={_fmt(c['norm_mean'])}",
        ),
    )
    for col, reduction in enumerate(reductions):
        by_key = {(c["weight"], c["batch"]): c for c in cells if c["reduction"] == reduction}
        for row, (field, label, cmap, (vmin, vmax), annotate) in enumerate(panels):
            grid = np.array(
                [
                    [by_key[(w, b)][field] if (w, b) in by_key else np.nan for b in batches]
                    for w in weights
                ],
                dtype=float,
            )
            if field == "mean_sample_penalty":
                grid = np.log10(np.clip(grid, 1e-6, None))
            ax = axes[row, col]
            ax.imshow(grid, cmap=cmap, vmin=vmin, vmax=vmax, origin="lower", aspect="auto")
            _annotate(ax, by_key, weights, batches, annotate)
            ax.set_title(f"{reduction}-reduced: {label}", fontsize=9)
    fig.suptitle(
        f"{args.dataset}, {args.steps} generator steps, {args.devices} devices", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    parser = harness.parser(__doc__)
    parser.add_argument(
        "--dataset", default="25gaussians", choices=("8gaussians", "25gaussians", "swissroll")
    )
    parser.add_argument("--weights", type=float, nargs="+", default=[0.1, 1.0, 10.0])
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 256, 1024, 2048])
    parser.add_argument("--reductions", nargs="+", choices=REDUCTIONS, default=list(REDUCTIONS))
    parser.add_argument("--steps", type=int, default=1500, help="generator iterations per cell")
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--name", default="lambda_batch", help="results/training/<name>.{md,json,png}"
    )
    args = parser.parse_args(argv)
    if len(jax.devices()) < args.devices:
        parser.error(f"--devices {args.devices}: only {len(jax.devices())} devices are visible")
    if args.steps < 10 or args.steps % 10:
        parser.error(f"--steps {args.steps} must be a positive multiple of 10")
    bad = [b for b in args.batches if b % args.devices]
    if bad:
        parser.error(f"--batches {bad} are not divisible by --devices {args.devices}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    cells = []
    for reduction in args.reductions:
        for weight in args.weights:
            for batch in args.batches:
                cell = train_cell(
                    args.dataset, reduction, weight, batch, args.steps, args.devices, args.seed
                )
                cells.append(cell)
                print(json.dumps(cell), flush=True)
                (RESULTS / f"{args.name}.json").write_text(json.dumps(cells, indent=1))
    write_table(cells, args, RESULTS / f"{args.name}.md")
    write_heatmap(cells, args, RESULTS / f"{args.name}.png")
    print(f"wrote {RESULTS / args.name}.{{md,json,png}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
