"""``--second-order auto``: the trainer's critic loss tuned once, the faster exact order picked."""

import dataclasses

import pytest

from fastgp._penalty.reference import naive_gradient_penalty
from fastgp.penalty import SECOND_ORDER
from fastgp.train.config import ConfigError
from fastgp.train.recipes.defaults import build_problem, default_config
from fastgp.train.run.penalty_tuning import _arguments, _critic_loss, choose_second_order
from fastgp.train.trainers.trainer import Trainer


@pytest.mark.parametrize(("dataset", "precision"), [("digits", "f32"), ("8gaussians", "bf16")])
def test_auto_becomes_the_faster_exact_second_order(dataset, precision):
    config = default_config(dataset, second_order="auto", precision=precision)
    problem = build_problem(dataset, config)
    chosen, tuning = choose_second_order(config, problem, local_batch=16, rounds=3)
    assert chosen.second_order in SECOND_ORDER
    assert dataclasses.replace(chosen, second_order="auto") == config  # nothing else changes
    assert len(tuning.results) == 2 and all(r.problem is None for r in tuning.results)
    fastest = min(tuning.results, key=lambda r: r.seconds or 0.0)
    assert fastest.variant is not None and fastest.variant.second_order == chosen.second_order


def test_the_tuned_loss_is_the_trainers_loss_with_the_naive_penalty():
    config = default_config("8gaussians", gp_weight=3.0)
    problem = build_problem("8gaussians", config)
    d_params, g_params, real, z, key = _arguments(config, problem, 8)
    loss = _critic_loss(config, problem, g_params)
    calls = []

    def recording(critic, x, **options):
        calls.append(options)
        return naive_gradient_penalty(critic, x, **options)

    value = loss(d_params, real, z, key, penalty=recording)
    assert calls == [{"kind": "wgan-gp", "target": config.gp_target, "weight": 3.0}]
    assert value.shape == () and bool(value == value)


def test_the_trainer_refuses_an_unresolved_auto():
    config = default_config("8gaussians", second_order="auto")
    problem = build_problem("8gaussians", config)
    with pytest.raises(ValueError, match="second_order='auto'"):
        Trainer(config, problem.generator, problem.critic, problem.sample_real)


def test_an_unknown_second_order_names_auto_among_the_choices():
    with pytest.raises(ConfigError, match="'auto'"):
        default_config("8gaussians", second_order="forward")
