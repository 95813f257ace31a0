"""Tune speed-to-quality of WGAN-GP on the 2-D toy sets: ``fastgp.train.trainers.trainer.Trainer``
on one device.

    JAX_PLATFORMS=cpu python -m benchmarks.training.tune_toy --dataset 25gaussians --seed 0

Every ``--eval-every`` generator steps are one ``Trainer.run`` call; between calls the
script prints modes captured, % high-quality samples (``--eval-samples`` samples) and wall time
since start, compilation included (``Trainer.run``: one dispatch per iteration on CPU). Defaults
are the dataset's tuned recipe (``fastgp.train.recipes.defaults.RECIPES``, also the defaults of
``fastgp train``); ``--paper`` sets the original gan_toy.py configuration.
"""

import argparse
import json
import time

import jax
import numpy as np

from fastgp.train.config import TrainConfig
from fastgp.train.data.quality import mode_quality
from fastgp.train.data.sets import sample_toy, toy_modes
from fastgp.train.models.networks import ACTIVATIONS
from fastgp.train.recipes.defaults import RECIPES, TOY_DEPTH, toy_networks
from fastgp.train.trainers.trainer import Trainer, make_mesh

PAPER = dict(
    width=512,
    depth=3,
    g_width=512,
    g_depth=3,
    noise_dim=2,
    activation="relu",
    weight=0.1,
    lr_d=1e-4,
    lr_g=1e-4,
    b1=0.5,
    b2=0.9,
    batch=256,
    n_critic=5,
    decay_frac=0.0,
    steps=3000,
)


def parse_args(argv=None):
    datasets = ("8gaussians", "25gaussians")
    first = argparse.ArgumentParser(add_help=False)
    first.add_argument("--dataset", default="8gaussians", choices=datasets)
    recipe = RECIPES[first.parse_known_args(argv)[0].dataset]
    r = recipe.fields
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--dataset",
        default="8gaussians",
        choices=datasets,
        help="also picks the recipe the other defaults come from",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=recipe.steps, help="generator steps")
    p.add_argument("--width", type=int, default=recipe.width, help="critic hidden width")
    p.add_argument("--depth", type=int, default=TOY_DEPTH, help="critic hidden layers")
    p.add_argument("--g-width", type=int, default=recipe.width, help="generator hidden width")
    p.add_argument("--g-depth", type=int, default=TOY_DEPTH, help="generator hidden layers")
    p.add_argument("--noise-dim", type=int, default=r["latent_dim"])
    p.add_argument("--activation", default="relu", choices=tuple(ACTIVATIONS))
    p.add_argument(
        "--weight", type=float, default=r["gp_weight"], help="gradient-penalty weight lambda"
    )
    p.add_argument("--lr-d", type=float, default=r["lr_d"])
    p.add_argument("--lr-g", type=float, default=r["lr_g"])
    p.add_argument("--b1", type=float, default=r["betas"][0])
    p.add_argument("--b2", type=float, default=r["betas"][1])
    p.add_argument("--batch", type=int, default=r["batch_size"])
    p.add_argument("--n-critic", type=int, default=r["n_critic"])
    p.add_argument(
        "--gp-every",
        type=int,
        default=r.get("gp_every", 1),
        help="penalty on every k-th critic step with weight k * lambda (lazy)",
    )
    p.add_argument(
        "--decay-frac",
        type=float,
        default=r["decay_fraction"],
        help="final fraction of training over which both learning rates decay "
        "linearly to 0 (0: constant)",
    )
    p.add_argument("--eval-every", type=int, default=1000, help="generator steps per jit call")
    p.add_argument("--eval-samples", type=int, default=2500)
    p.add_argument("--paper", action="store_true", help="use the original gan_toy.py settings")
    p.add_argument("--json", action="store_true", help="print a final JSON summary line")
    args = p.parse_args(argv)
    if args.paper:
        for k, v in PAPER.items():
            setattr(args, k, v)
    if args.steps % args.eval_every:
        p.error(f"--steps {args.steps} must be a multiple of --eval-every {args.eval_every}")
    return args


def build(args):
    """A one-device ``Trainer`` for the flags (penalty on the plain XLA path)."""
    config = TrainConfig(
        batch_size=args.batch,
        n_critic=args.n_critic,
        gp_weight=args.weight,
        lr_g=args.lr_g,
        lr_d=args.lr_d,
        betas=(args.b1, args.b2),
        gp_every=args.gp_every,
        latent_dim=args.noise_dim,
        seed=args.seed,
        backend="xla",
        total_steps=args.steps,
        decay_fraction=args.decay_frac,
    )
    generator, critic = toy_networks(
        args.noise_dim, args.width, args.depth, args.activation, args.g_width, args.g_depth
    )
    return Trainer(
        config,
        generator,
        critic,
        lambda key, n: sample_toy(args.dataset, key, n),
        mesh=make_mesh(jax.devices()[:1]),
    )


def main(argv=None):
    args = parse_args(argv)
    centers, sigma = toy_modes(args.dataset)
    t0 = time.perf_counter()
    trainer = build(args)
    state = trainer.init()
    eval_key = jax.random.PRNGKey(10_000 + args.seed)
    first_hit = None
    for done in range(args.eval_every, args.steps + 1, args.eval_every):
        state, _ = trainer.run(state, args.eval_every)
        samples = np.asarray(trainer.sample(state, eval_key, args.eval_samples))
        q = mode_quality(samples, centers, sigma)
        wall = time.perf_counter() - t0
        hit = q["modes"] == q["total_modes"] and q["high_quality"] >= 80.0
        if hit and first_hit is None:
            first_hit = (done, wall)
        print(
            f"step {done:6d}  modes {q['modes']:2d}/{q['total_modes']}  "
            f"hq {q['high_quality']:5.1f}%  wall {wall:6.1f}s",
            flush=True,
        )
    if args.json:
        summary = dict(
            vars(args),
            modes=q["modes"],
            total_modes=q["total_modes"],
            high_quality=q["high_quality"],
            wall_s=round(wall, 1),
            first_target=first_hit,
        )
        print(json.dumps(summary))
    return q, wall


if __name__ == "__main__":
    main()
