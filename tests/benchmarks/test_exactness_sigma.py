"""The sigma sweep read along a run's checkpoints: every checkpoint's critic, exact R1 equal to a
plain per-sample gradient norm, the approximation's mean near it where the critic is linear."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks.exactness import sigma
from fastgp.train.data.sets import load_mnist
from fastgp.train.recipes.defaults import build_problem, default_config
from fastgp.train.run.checkpoints import Checkpoints
from fastgp.train.trainers.state import init_state


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A run folder with run.json and two checkpoints whose critics differ."""
    out = tmp_path_factory.mktemp("run")
    config = default_config("mnist", critic="vit", backend="xla", total_steps=10)
    (out / "run.json").write_text(json.dumps({"config": json.loads(json.dumps(config.__dict__))}))
    problem = build_problem("mnist", config)
    state = init_state(config, problem.generator, problem.critic)
    checkpoints = Checkpoints(out / "checkpoints")
    meta = {"dataset": "mnist", "config": json.loads(json.dumps(config.__dict__))}
    checkpoints.save(2, state, meta)
    moved = state._replace(d_params=jax.tree.map(lambda p: 1.3 * p, state.d_params))
    checkpoints.save(5, moved, meta)
    checkpoints.close()
    return out, problem.critic, state.d_params


def test_every_checkpoint_is_swept_and_exact_r1_is_the_plain_norm(run_dir):
    out, critic, params = run_dir
    assert sigma.checkpoint_steps(out) == [2, 5]
    rows = [r for step in (2, 5) for r in sigma.sweep(out, [0.01], 8, 16, step)]
    assert [r["step"] for r in rows] == [2, 5]
    assert rows[0]["exact"] != rows[1]["exact"]
    x = jnp.asarray(load_mnist("held_out")[:16])
    per_sample = jax.vmap(jax.grad(lambda y: critic.apply(params, y[None])[0]))(x)
    plain = float(np.mean(np.sum(np.asarray(per_sample, np.float64) ** 2, axis=(1, 2, 3))))
    assert rows[0]["exact"] == pytest.approx(plain, rel=1e-4)
    for row in rows:
        assert -1.0 <= row["cosine_one_draw"] <= 1.0
        assert abs(row["ratio_mean"] - 1.0) < 0.5  # a fresh critic is near-linear at 0.01
