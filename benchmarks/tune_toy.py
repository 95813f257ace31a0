"""Single-device WGAN-GP trainer on the toy 2-D datasets, for tuning speed-to-quality on CPU.

    JAX_PLATFORMS=cpu python benchmarks/tune_toy.py --dataset 25gaussians --seed 0

Every ``--eval-every`` generator steps run inside one jitted ``lax.scan`` (with the ``n_critic``
critic steps scanned inside it); between calls the script prints modes captured, % high-quality
samples (``--eval-samples`` samples) and wall time since start, compilation included.
Defaults are the tuned recipe; ``--paper`` sets the original gan_toy.py configuration.
"""

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fastgp.data import sample_toy, toy_modes
from fastgp.models import ACTIVATIONS, mlp
from fastgp.penalty import gradient_penalty, interpolate
from fastgp.quality import mode_quality

PAPER = dict(width=512, depth=3, g_width=512, g_depth=3, noise_dim=2, activation="relu",
             weight=0.1, lr_d=1e-4, lr_g=1e-4, b1=0.5, b2=0.9, batch=256, n_critic=5,
             decay_frac=0.0, steps=3000)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--dataset", default="8gaussians", choices=("8gaussians", "25gaussians"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=6000, help="generator steps")
    p.add_argument("--width", type=int, default=128, help="critic hidden width")
    p.add_argument("--depth", type=int, default=3, help="critic hidden layers")
    p.add_argument("--g-width", type=int, default=128, help="generator hidden width")
    p.add_argument("--g-depth", type=int, default=3, help="generator hidden layers")
    p.add_argument("--noise-dim", type=int, default=2)
    p.add_argument("--activation", default="relu", choices=tuple(ACTIVATIONS))
    p.add_argument("--weight", type=float, default=1.0, help="gradient-penalty weight lambda")
    p.add_argument("--lr-d", type=float, default=2e-3)
    p.add_argument("--lr-g", type=float, default=2e-3)
    p.add_argument("--b1", type=float, default=0.5)
    p.add_argument("--b2", type=float, default=0.9)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--n-critic", type=int, default=5)
    p.add_argument("--decay-frac", type=float, default=0.5,
                   help="final fraction of training over which both learning rates decay "
                        "linearly to --decay-to times their value (0: constant)")
    p.add_argument("--decay-to", type=float, default=0.0)
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


def schedule(lr, total, decay_frac, decay_to):
    """Constant ``lr``, then linear decay to ``lr * decay_to`` over the last ``decay_frac``."""
    if decay_frac <= 0:
        return optax.constant_schedule(lr)
    start = int(total * (1.0 - decay_frac))
    return optax.join_schedules(
        [optax.constant_schedule(lr), optax.linear_schedule(lr, lr * decay_to, total - start)],
        [start])


def build(args):
    """(init_state(key), run_chunk(state) -> state, sample(params, key) -> (N, 2))."""
    critic = mlp([2] + [args.width] * args.depth + [1], args.activation)
    gen = mlp([args.noise_dim] + [args.g_width] * args.g_depth + [2], args.activation)
    opt_d = optax.adam(schedule(args.lr_d, args.steps * args.n_critic, args.decay_frac,
                                args.decay_to), b1=args.b1, b2=args.b2)
    opt_g = optax.adam(schedule(args.lr_g, args.steps, args.decay_frac, args.decay_to),
                       b1=args.b1, b2=args.b2)
    B = args.batch

    def init_state(key):
        kd, kg, key = jax.random.split(key, 3)
        pd, pg = critic.init(kd), gen.init(kg)
        return pd, opt_d.init(pd), pg, opt_g.init(pg), key

    def fake_batch(pg, key, n):
        return gen.apply(pg, jax.random.normal(key, (n, args.noise_dim), jnp.float32))

    def critic_loss(pd, real, fake, key):
        D = lambda x: critic.apply(pd, x)  # noqa: E731
        wass = jnp.mean(D(fake)) - jnp.mean(D(real))
        gp = gradient_penalty(D, interpolate(key, real, fake), weight=args.weight, backend="xla")
        return wass + gp

    def critic_step(carry, key):
        pd, sd, pg = carry
        kr, kz, ka = jax.random.split(key, 3)
        real = sample_toy(args.dataset, kr, B)
        fake = jax.lax.stop_gradient(fake_batch(pg, kz, B))
        grads = jax.grad(critic_loss)(pd, real, fake, ka)
        updates, sd = opt_d.update(grads, sd, pd)
        return (optax.apply_updates(pd, updates), sd, pg), None

    def gen_step(state, _):
        pd, sd, pg, sg, key = state
        key, kc, kz = jax.random.split(key, 3)
        (pd, sd, pg), _ = jax.lax.scan(critic_step, (pd, sd, pg),
                                       jax.random.split(kc, args.n_critic))
        grads = jax.grad(lambda p: -jnp.mean(critic.apply(pd, fake_batch(p, kz, B))))(pg)
        updates, sg = opt_g.update(grads, sg, pg)
        return (pd, sd, optax.apply_updates(pg, updates), sg, key), None

    @jax.jit
    def run_chunk(state):
        state, _ = jax.lax.scan(gen_step, state, None, length=args.eval_every)
        return state

    sample = jax.jit(lambda pg, key: fake_batch(pg, key, args.eval_samples))
    return init_state, run_chunk, sample


def main(argv=None):
    args = parse_args(argv)
    centers, sigma = toy_modes(args.dataset)
    t0 = time.perf_counter()
    init_state, run_chunk, sample = build(args)
    state = init_state(jax.random.key(args.seed))
    eval_key = jax.random.key(10_000 + args.seed)
    first_hit = None
    for done in range(args.eval_every, args.steps + 1, args.eval_every):
        state = jax.block_until_ready(run_chunk(state))
        q = mode_quality(np.asarray(sample(state[2], eval_key)), centers, sigma)
        wall = time.perf_counter() - t0
        hit = q["modes"] == q["total_modes"] and q["high_quality"] >= 80.0
        if hit and first_hit is None:
            first_hit = (done, wall)
        print(f"step {done:6d}  modes {q['modes']:2d}/{q['total_modes']}  "
              f"hq {q['high_quality']:5.1f}%  wall {wall:6.1f}s", flush=True)
    if args.json:
        summary = dict(vars(args), modes=q["modes"], total_modes=q["total_modes"],
                       high_quality=q["high_quality"], wall_s=round(wall, 1),
                       first_target=first_hit)
        print(json.dumps(summary))
    return q, wall


if __name__ == "__main__":
    main()
