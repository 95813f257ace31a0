"""Where approximate R1 stops agreeing with exact R1: a sigma sweep on the study's trained critics.

    JAX_PLATFORMS=cpu python -m benchmarks.exactness.sigma RUN_DIR [RUN_DIR ...]
        [--sigmas 1e-4 1e-3 1e-2 3e-2 0.1 0.3 1] [--draws 8] [--batch 64] [--along NAME]
    -> benchmarks/results/exactness/sigma.{json,md}, or NAME.json with --along (every
       checkpoint of each run: the cosine along training)

RUN_DIR is a ``fastgp train --dataset mnist`` output (``benchmarks.exactness.study --keep``), named
in the table by its loss and penalty: its newest checkpoint's critic, on ``--batch`` held-out real
digits. Exact R1 is ``gradient_penalty(kind="r1", weight=1)``; approximate R1 is ``approximate_r1``
with weight ``1 / sigma^2`` (the scaling under which both read as the same R1 weight), in float32 as
the trainer runs it. For each sigma: the value ratio approximate / exact for one noise draw per
sample (what a training step sees) and the mean over ``--draws`` draws, and the cosine between the
critic-parameter gradients (one draw; the mean of the draws). Large sigma leaves the linear regime
of the critic (bias); small sigma cancels float32's digits in D(x + sigma eps) - D(x)."""

import dataclasses
import functools
import json
import pathlib
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import benchmarks
from benchmarks import harness, records
from benchmarks.exactness.tables import sigma_table
from fastgp import approximate_r1, gradient_penalty
from fastgp.train.config import TrainConfig
from fastgp.train.data.sets import load_mnist
from fastgp.train.recipes.defaults import build_problem
from fastgp.train.run.checkpoints import Checkpoints
from fastgp.train.trainers.state import init_state

RESULTS = benchmarks.RESULTS / "exactness"


def trained_critic(run_dir: pathlib.Path, step: int | None = None) -> tuple[TrainConfig, Any, Any]:
    """(config, critic Model, critic parameters) of a run's checkpoint ``step`` (None: its
    newest)."""
    run = json.loads((run_dir / "run.json").read_text())
    config = TrainConfig(**{**run["config"], "betas": tuple(run["config"]["betas"])})
    problem = build_problem("mnist", config)
    template = init_state(config, problem.generator, problem.critic)
    checkpoints = Checkpoints(run_dir / "checkpoints")
    chosen = checkpoints.latest_step() if step is None else step
    if chosen is None:
        raise ValueError(f"{run_dir} holds no checkpoint")
    state = checkpoints.state(chosen, template)
    checkpoints.close()
    return config, problem.critic, state.d_params


def checkpoint_steps(run_dir: pathlib.Path) -> list[int]:
    """The steps of a run's checkpoints, oldest first."""
    checkpoints = Checkpoints(run_dir / "checkpoints")
    steps = checkpoints.steps()
    checkpoints.close()
    return steps


def _cosine(a: Any, b: Any) -> float:
    a, b = (np.concatenate([np.ravel(x) for x in jax.tree.leaves(t)]) for t in (a, b))
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@functools.cache
def _penalties(config: TrainConfig, batch: int) -> tuple[Any, Any]:
    """(exact, approx) for ``config``'s critic on ``batch`` held-out digits, compiled once per
    configuration: ``exact(params)`` -> value and parameter gradient of exact R1 at weight 1;
    ``approx(params, key, sigma)`` -> the same of approximate R1 at weight 1 / sigma^2."""
    critic = build_problem("mnist", config).critic
    x = jnp.asarray(load_mnist("held_out")[:batch])
    apply = lambda p, y: critic.apply(p, y)
    exact = jax.jit(
        jax.value_and_grad(
            lambda p: gradient_penalty(lambda y: apply(p, y), x, kind="r1", weight=1.0)
        )
    )

    @jax.jit
    def approx(p: Any, key: jax.Array, sigma: jax.Array) -> Any:
        loss = lambda q: approximate_r1(
            lambda y: apply(q, y), x, key, sigma=sigma, weight=1.0 / sigma**2
        )
        return jax.value_and_grad(loss)(p)

    return exact, approx


def sweep(
    run_dir: pathlib.Path, sigmas: list[float], draws: int, batch: int, step: int | None = None
) -> list[dict]:
    """The sweep's rows for one trained critic (checkpoint ``step``; None: the newest)."""
    config, _, params = trained_critic(run_dir, step)
    trained_with = f"{config.loss} loss, {config.gp_kind} at {config.placement}"
    exact, approx = _penalties(dataclasses.replace(config, seed=0), batch)  # one per arm
    value, grads = exact(params)

    rows = []
    for sigma in sigmas:
        outs = [approx(params, jax.random.PRNGKey(d), jnp.float32(sigma)) for d in range(draws)]
        values = np.array([float(v) for v, _ in outs])
        mean_grads = jax.tree.map(lambda *g: np.mean(np.stack(g), 0), *[g for _, g in outs])
        rows.append(
            {
                "run": trained_with,
                **({} if step is None else {"step": step}),
                "sigma": sigma,
                "exact": float(value),
                "ratio_one_draw": float(values[0] / value),
                "ratio_mean": float(values.mean() / value),
                "cosine_one_draw": _cosine(outs[0][1], grads),
                "cosine_mean": _cosine(mean_grads, grads),
            }
        )
    return rows


def markdown(result: dict[str, Any]) -> str:
    command = " ".join(["JAX_PLATFORMS=cpu python -m benchmarks.exactness.sigma", *result["argv"]])
    return records.page(
        "Approximate against exact R1 on trained critics, by sigma",
        f"Generated by `{command}`. Approximate R1 at weight 1/sigma^2 against exact R1 at weight "
        "1 (1.000 and 1.000 is agreement), on held-out MNIST digits, float32.",
        sigma_table(result),
        result,
    )


def along(runs: list[pathlib.Path], sigmas: list[float], draws: int, batch: int, name: str) -> int:
    """The sweep at every checkpoint of each run (a run keeps its newest three, the declared
    study's last three evaluations) -> benchmarks/results/exactness/NAME.json: each row names its
    run's folder and step, so the cosine can be read along training."""
    rows = [
        {"folder": run.name, **row}
        for run in runs
        for step in checkpoint_steps(run)
        for row in sweep(run, sigmas, draws, batch, step)
    ]
    result = {"argv": [str(r) for r in runs], "draws": draws, **records.provenance(), "rows": rows}
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    for row in rows:
        print(json.dumps(row))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(__doc__)
    parser.add_argument("runs", nargs="+", type=pathlib.Path)
    parser.add_argument(
        "--sigmas", nargs="+", type=float, default=[1e-4, 1e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0]
    )
    parser.add_argument("--draws", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument(
        "--along", help="every checkpoint of each run, not the newest; results file NAME"
    )
    args = parser.parse_args(argv)
    if args.along:
        return along(args.runs, args.sigmas, args.draws, args.batch, args.along)
    rows = [r for run in args.runs for r in sweep(run, args.sigmas, args.draws, args.batch)]
    argv_used = sys.argv[1:] if argv is None else list(argv)
    result = {"argv": argv_used, "draws": args.draws, **records.provenance(), "rows": rows}
    records.write(RESULTS / "sigma", result, markdown)
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
