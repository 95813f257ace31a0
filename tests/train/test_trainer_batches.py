"""The sharded trainer's real batches: the naive trainer's draws, in a program whose size does not
grow with ``n_critic`` (``--n-critic 150`` used to unroll 150 samplers)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastgp.train.recipes.defaults import build_problem, default_config
from fastgp.train.trainers.state import critic_keys
from fastgp.train.trainers.trainer import Trainer, make_mesh


def _trainer(dataset, **overrides):
    config = default_config(dataset, backend="xla", **overrides)
    problem = build_problem(dataset, config)
    return Trainer(
        config,
        problem.generator,
        problem.critic,
        problem.sample_real,
        mesh=make_mesh(jax.devices()[:1]),
    )


@pytest.mark.parametrize("dataset", ["8gaussians", "25gaussians", "swissroll", "digits"])
def test_real_batches_are_the_naive_trainers_draws(dataset):
    trainer = _trainer(dataset, batch_size=24, n_critic=3)
    state = trainer.init()._replace(iteration=jnp.int32(7))
    batches = np.asarray(jax.jit(trainer._real_batches)(state))
    # fastgp.train.trainers.naive_trainer draws one batch per critic step, each in its own program.
    draw = jax.jit(lambda key: trainer.sample_real(key, 24).astype(jnp.float32))
    naive = np.stack(
        [np.asarray(draw(critic_keys(state.key, state.iteration, step)[0])) for step in range(3)]
    )
    assert batches.shape == naive.shape and batches.dtype == np.float32
    assert np.array_equal(batches, naive)


def test_program_size_does_not_grow_with_n_critic():
    sizes = {}
    for n_critic in (2, 60):
        trainer = _trainer("8gaussians", batch_size=16, n_critic=n_critic)
        # Traced at once, in this iteration: the late binding of trainer is not an issue.
        jaxpr = jax.make_jaxpr(lambda state: trainer._run(state, 1))(trainer.init())  # noqa: B023
        sizes[n_critic] = len(str(jaxpr))
    assert sizes[60] < 1.05 * sizes[2], sizes
