"""approximate_r1 against exact R1 on zoo critics, at initialisation and trained: bias and cost.

    JAX_PLATFORMS=cpu python -m benchmarks.approximate_r1.ratios [--critics vit32 lnconv32 dcgan32]
        [--sigmas 0.001 0.01 0.1] [--train-steps 0 200] [--draws 64] [--rounds 10] [--no-times]
        [--out PATH]
    -> benchmarks/results/approximate_r1/approximate_r1.{json,md}

For each critic (``zoo.critics.ZOO_CPU``: its CPU batch, float32, parameters from ``init``), each
count of ``--train-steps`` (the critic trained that many Adam steps, ``workloads.optimizer``, on the
WGAN-GP critic loss with weight 10, separating fresh batches of real ~ N(+0.25, I) from fake ~
N(-0.25, I); 0 = at initialisation) and each sigma, ``--draws`` independent noise keys give, at
standard-normal inputs x, draws of

    ratio = approximate_r1(critic, x, key, sigma=sigma, weight=1) / (sigma**2 * R1)

with R1 = ``gradient_penalty(critic, x, kind="r1", weight=1)``; E[ratio] = 1 + O(sigma**2). The
table gives the mean with its standard error, the spread of one draw (standard deviation, 5th and
95th percentiles): what one training step sees. Then the CPU time of one critic step's parameter
gradient, ``jax.jit(jax.value_and_grad(loss))`` with loss = mean D(fake) - mean D(real) plus
nothing (plain), exact R1 at the reals, or approximate_r1 at the reals, timed interleaved
(``fastgp.measure.interleaved_times``), medians and their ratio to the exact step.
"""

import functools
import json
import pathlib
import platform
import sys

import jax
import numpy as np
import optax

import benchmarks
from benchmarks import harness, records, workloads
from benchmarks.tables import markdown_table
from benchmarks.zoo import critics as zoo
from fastgp import approximate_r1, gradient_penalty, interpolate
from fastgp.measure import interleaved_times

RESULTS = benchmarks.RESULTS / "approximate_r1"
SIGMAS = (0.001, 0.01, 0.1)
DEFAULT_CRITICS = ("vit32", "lnconv32", "dcgan32")
APT_WEIGHT = 100.0  # APT's lambda: the timed approximate step uses it, exact R1 its sigma^2 match


SHIFT = 0.25  # the mean of the real inputs, minus that of the fake ones, of the trained critic


def trained(spec, params, steps, seed=0):
    """The critic's parameters after ``steps`` WGAN-GP critic steps on shifted normal batches."""
    optimizer = workloads.optimizer()
    shape = (spec.batch, *spec.shape)

    def loss(p, key):
        critic = functools.partial(spec.model.apply, p, dtype=spec.dtype)
        k_real, k_fake, k_alpha = jax.random.split(key, 3)
        real = jax.random.normal(k_real, shape) + SHIFT
        fake = jax.random.normal(k_fake, shape) - SHIFT
        x_hat = interpolate(k_alpha, real, fake)
        penalty = gradient_penalty(critic, x_hat, weight=workloads.GP_WEIGHT)
        return critic(fake).mean() - critic(real).mean() + penalty

    @jax.jit
    def step(p, state, key):
        grads = jax.grad(loss)(p, key)
        updates, state = optimizer.update(grads, state, p)
        return optax.apply_updates(p, updates), state

    state = optimizer.init(params)
    for key in jax.random.split(jax.random.key(seed + 1), steps):
        params, state = step(params, state, key)
    return params


def ratios(spec, params, x, sigma, draws):
    """(draws,) float64 ratios approximate_r1 / (sigma^2 R1) for keys 0..draws-1."""
    critic = lambda p: functools.partial(spec.model.apply, p, dtype=spec.dtype)
    exact = jax.jit(lambda p, y: gradient_penalty(critic(p), y, kind="r1", weight=1.0))
    r1 = float(exact(params, x))
    one = jax.jit(lambda p, y, k: approximate_r1(critic(p), y, k, sigma=sigma, weight=1.0))
    values = [float(one(params, x, jax.random.key(i))) for i in range(draws)]
    return np.asarray(values, np.float64) / (sigma**2 * r1)


def ratio_row(name, batch, steps, sigma, r):
    return {
        "critic": name,
        "batch": batch,
        "train_steps": steps,
        "sigma": sigma,
        "draws": int(r.size),
        "mean": float(r.mean()),
        "standard_error": float(r.std(ddof=1) / np.sqrt(r.size)),
        "std": float(r.std(ddof=1)),
        "p05": float(np.percentile(r, 5)),
        "p95": float(np.percentile(r, 95)),
    }


def step_times(spec, params, real, fake, rounds, sigma=0.01):
    """Median seconds of the critic step's value_and_grad: plain, exact R1, approximate_r1."""

    def loss(kind, p, real, fake, key):
        critic = functools.partial(spec.model.apply, p, dtype=spec.dtype)
        value = critic(fake).mean() - critic(real).mean()
        if kind == "exact-r1":
            value += gradient_penalty(critic, real, kind="r1", weight=APT_WEIGHT * sigma**2)
        elif kind == "approximate-r1":
            value += approximate_r1(critic, real, key, sigma=sigma, weight=APT_WEIGHT)
        return value

    key = jax.random.key(0)
    steps = {
        kind: jax.jit(jax.value_and_grad(functools.partial(loss, kind)))
        for kind in ("plain", "exact-r1", "approximate-r1")
    }
    calls = {
        kind: (lambda f=f: jax.block_until_ready(f(params, real, fake, key)))
        for kind, f in steps.items()
    }
    samples = interleaved_times(calls, rounds=rounds, warmup=2)
    return {kind: float(np.median(s)) for kind, s in samples.items()}


def _ratio_table(result) -> list[str]:
    """The ratios per critic, batch, trained steps and sigma."""
    return markdown_table(
        [
            *("critic", "batch", "trained steps", "sigma"),
            *("ratio mean ± s.e.", "std of one draw", "5%-95%"),
        ],
        (
            [
                row["critic"],
                row["batch"],
                row.get("train_steps", 0),
                f"{row['sigma']:g}",
                f"{row['mean']:.4f} ± {row['standard_error']:.4f}",
                f"{row['std']:.3f}",
                f"{row['p05']:.3f}-{row['p95']:.3f}",
            ]
            for row in result["ratios"]
        ),
    )


def _time_section(result) -> list[str]:
    """The critic steps' times, when they were measured."""
    return [
        "",
        (
            "Critic step (value_and_grad of mean D(fake) - mean D(real) + the penalty at the "
            f"reals with respect to the parameters), median of {result['rounds']} interleaved "
            f"rounds: approximate_r1 with weight {APT_WEIGHT:g} and sigma 0.01, exact R1 with "
            f"weight {APT_WEIGHT:g} x 0.01^2."
        ),
        "",
        *markdown_table(
            [
                *("critic", "batch", "plain ms", "exact R1 ms"),
                *("approximate_r1 ms", "approximate / exact"),
            ],
            (
                [
                    row["critic"],
                    row["batch"],
                    f"{1e3 * row['plain']:.2f}",
                    f"{1e3 * row['exact-r1']:.2f}",
                    f"{1e3 * row['approximate-r1']:.2f}",
                    f"{row['approximate-r1'] / row['exact-r1']:.3f}x",
                ]
                for row in result["times"]
            ),
        ),
    ]


def markdown(result) -> str:
    lines = [
        "# approximate_r1 against exact R1 (zoo critics, CPU, float32)",
        "",
        "Generated by `"
        + " ".join(
            ["JAX_PLATFORMS=cpu python -m benchmarks.approximate_r1.ratios", *result["argv"]]
        )
        + "`. ratio = approximate_r1(weight 1) / (sigma^2 R1) at standard-normal inputs, one draw "
        "per noise key; mean ± its standard error, the spread of a single draw (std, 5th-95th "
        "percentile). Trained steps: 0 = at initialisation, else Adam steps of the WGAN-GP "
        f"critic loss separating N(+{SHIFT:g}, I) from N(-{SHIFT:g}, I) batches.",
        "",
        *_ratio_table(result),
    ]
    if result["times"]:
        lines += _time_section(result)
    lines += ["", f"Machine: {result['machine']}; JAX {result['jax']}.", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = harness.parser(__doc__)
    parser.add_argument("--critics", nargs="+", choices=tuple(zoo.ZOO_CPU), default=DEFAULT_CRITICS)
    parser.add_argument("--sigmas", nargs="+", type=float, default=SIGMAS)
    parser.add_argument("--train-steps", nargs="+", type=int, default=(0, 200))
    parser.add_argument("--draws", type=int, default=64)
    parser.add_argument("--no-times", action="store_true", help="only the ratios")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS / "approximate_r1")
    args = parser.parse_args(argv)
    result = {
        "argv": sys.argv[1:] if argv is None else list(argv),
        "draws": args.draws,
        "rounds": args.rounds,
        "machine": f"{platform.machine()}, {jax.device_count()} CPU device(s)",
        "jax": jax.__version__,
        "ratios": [],
        "times": [],
    }
    for name in args.critics:
        spec = zoo.ZOO_CPU[name]
        params, _, real, fake, _ = workloads.inputs(spec)
        for steps in args.train_steps:
            critic_params = trained(spec, params, steps)
            for sigma in args.sigmas:
                r = ratios(spec, critic_params, real, sigma, args.draws)
                row = ratio_row(name, spec.batch, steps, sigma, r)
                print(json.dumps(row), flush=True)
                result["ratios"].append(row)
        if args.no_times:
            continue
        times = {"critic": name, "batch": spec.batch}
        times.update(step_times(spec, params, real, fake, args.rounds))
        print(json.dumps(times), flush=True)
        result["times"].append(times)
    records.write(args.out, result, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
