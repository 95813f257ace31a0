"""The trainer's compiled steps issue as few collectives as the maths needs (counted in HLO)."""

import functools

import jax
import jax.numpy as jnp
import pytest

from benchmarks.tpu.collectives import count_collectives, operand_shapes
from fastgp.train.recipes.defaults import build_problem, default_config
from fastgp.train.trainers.trainer import Trainer, make_mesh


@functools.cache
def compiled_steps(devices, batch_size=32):
    config = default_config("8gaussians", batch_size=batch_size, backend="xla", n_critic=3)
    problem = build_problem("8gaussians", config)
    trainer = Trainer(
        config,
        problem.generator,
        problem.critic,
        problem.sample_real,
        mesh=make_mesh(jax.devices()[:devices]),
    )
    state = trainer.init()
    real = jax.device_put(
        jnp.zeros((batch_size, 2)), jax.NamedSharding(trainer.mesh, jax.P("data"))
    )
    critic = trainer.critic_step.lower(state, real, jnp.int32(0)).compile().as_text()
    iteration = trainer.run.lower(state, 1).compile().as_text()
    return count_collectives(critic), count_collectives(iteration)


@pytest.mark.parametrize("devices", [2, 4])
def test_a_critic_step_is_two_all_reduces_and_nothing_else(devices):
    """One all-reduce for the global means and the parameter gradients (XLA combines them), one
    for the packed per-core diagnostics (they read the global losses, so they come after)."""
    critic, _ = compiled_steps(devices)
    assert set(critic) == {"all-reduce"}, critic
    assert critic["all-reduce"]["count"] <= 2, critic


def test_a_generator_iteration_gathers_no_scalars_one_by_one():
    _, iteration = compiled_steps(4)
    assert "all-gather" not in iteration, iteration
    assert iteration["all-reduce"]["count"] <= 5, iteration


def test_the_counter_reads_tuple_and_async_collectives():
    text = """
  %all-reduce = (f32[2,3]{1,0}, /*index=1*/f32[4]{0}) all-reduce(%a, %b), channel_id=1
  %ag = bf16[8,16]{1,0} all-gather-start(%c), dimensions={0}
  %ag.done = bf16[8,16]{1,0} all-gather-done(%ag)
  %add = f32[] add(%x, %y)
"""
    assert count_collectives(text) == {
        "all-reduce": {"count": 1, "bytes": 40},
        "all-gather": {"count": 1, "bytes": 256},
    }


def test_each_gradient_all_reduce_is_one_raveled_operand():
    """Written out, an iteration with C critic steps is C gradient all-reduces of ONE float32
    vector (the raveled critic, not an operand per weight and use), one for the generator's
    gradient with the steps' global means, and one for the iteration's packed metrics."""
    n_critic = 3
    config = default_config("8gaussians", batch_size=32, backend="xla", n_critic=n_critic)
    problem = build_problem("8gaussians", config)
    trainer = Trainer(
        config,
        problem.generator,
        problem.critic,
        problem.sample_real,
        mesh=make_mesh(jax.devices()[:4]),
    )
    state = trainer.init()
    text = trainer.iteration.lower(state).compile().as_text()
    assert text is not None
    assert count_collectives(text)["all-reduce"]["count"] == n_critic + 2, text
    critic_size = sum(leaf.size for leaf in jax.tree.leaves(state.d_params))
    single = [
        line for line in text.splitlines() if f"= f32[{critic_size}]{{0}} all-reduce(" in line
    ]
    assert len(single) == n_critic, single
    # The global scalars that ride with the generator's gradient: each critic step's W (one
    # mean of D(real) - D(fake)) and penalty, and the generator loss.
    scalars = operand_shapes(text).count("f32[]")
    assert scalars == 2 * n_critic + 1, text
