"""``fastgp tune MODULE:FUNCTION``: a user's loss tuned from the command line; bad targets named."""

import json
import re
import textwrap

import pytest

from fastgp.train.cli.main import main

LOSSES = textwrap.dedent(
    """
    import functools

    import jax

    from fastgp import interpolate
    from fastgp.train.models.networks import mlp

    MODEL = mlp([4, 16, 1])


    def critic_loss(params, real, fake, key, *, penalty):
        critic = functools.partial(MODEL.apply, params)
        x_hat = interpolate(key, real, fake)
        return critic(fake).mean() - critic(real).mean() + penalty(critic, x_hat)


    def build():
        k1, k2, k3, k4 = jax.random.split(jax.random.PRNGKey(0), 4)
        real, fake = jax.random.normal(k2, (8, 4)), jax.random.normal(k3, (8, 4))
        return critic_loss, MODEL.init(k1), real, fake, k4


    def no_penalty_argument():
        _, params, real, fake, key = build()
        return (lambda params, real, fake, key: real.sum()), params, real, fake, key


    def not_a_tuple():
        return 3
    """
)


@pytest.fixture
def losses(tmp_path):
    path = tmp_path / "losses.py"
    path.write_text(LOSSES)
    return path


def test_tune_prints_the_table_and_writes_the_pick(losses, tmp_path, capsys):
    out = tmp_path / "tuning.json"
    code = main(["tune", f"{losses}:build", "--rounds", "2", "--json", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    assert "naive (nested jax.grad)" in printed and "best: gradient_penalty(..., " in printed
    record = json.loads(out.read_text())
    assert set(record["best"]) == {"second_order", "remat", "backend"}
    assert len(record["variants"]) == 7  # six CPU variants and the naive yardstick
    assert all(v["gradient_error"] <= 1e-5 for v in record["variants"])


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("no_such_module_here:build", "cannot import 'no_such_module_here'"),
        ("{losses}:missing", "has no function 'missing'"),
        ("{losses}:not_a_tuple", r"must return \(critic_loss, params, \*args\)"),
        ("{losses}:no_penalty_argument", "penalty as a keyword argument"),
        ("{losses}", "expected MODULE:FUNCTION"),
        ("/nowhere/losses.py:build", "no such file"),
    ],
)
def test_a_bad_target_exits_2_naming_the_problem(losses, capsys, target, message):
    code = main(["tune", target.format(losses=losses)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("fastgp tune: error: ")
    assert re.search(message, err), err
