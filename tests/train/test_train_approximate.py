"""``fastgp train --gp-kind approximate-r1``: the config, the flags, and the sharded trainer
against the one-device trainer (same random numbers, the global-batch noise of approximate_r1)."""

import jax
import numpy as np
import pytest

from fastgp.train.cli.parser import build_parser
from fastgp.train.config import ConfigError, TrainConfig
from fastgp.train.models.networks import mlp
from fastgp.train.trainers.naive_trainer import NaiveTrainer
from fastgp.train.trainers.trainer import Trainer, make_mesh


def problem():
    return (
        mlp([2, 16, 2], "gelu"),
        mlp([2, 16, 1], "gelu"),
        lambda key, n: jax.random.normal(key, (n, 2)),
    )


def config(**overrides):
    base = dict(batch_size=8, n_critic=2, backend="xla", lr_g=1e-3, lr_d=1e-3)
    return TrainConfig(**{**base, "gp_kind": "approximate-r1", "gp_sigma": 0.1, **overrides})


def test_sharded_trainer_equals_the_one_device_trainer():
    cfg = config(gp_weight=100.0)
    sharded = Trainer(cfg, *problem(), mesh=make_mesh(jax.devices()[:4]))
    state, metrics = sharded.run(sharded.init(), 2)
    naive = NaiveTrainer(cfg, *problem())
    ref, ref_metrics = naive.run(naive.init(), 2)
    penalty = np.asarray(metrics["penalty"])[..., 0]  # core 0; every core holds the global value
    np.testing.assert_allclose(penalty, ref_metrics["penalty"], rtol=1e-5)
    assert np.all(penalty > 0)
    for a, b in zip(jax.tree.leaves(state.d_params), jax.tree.leaves(ref.d_params), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
    # no input-gradient is taken, so there are no norms to report
    assert np.all(np.isnan(np.asarray(metrics["norm_mean"])))


def test_the_kind_changes_what_is_trained():
    """The comparison above can fail: R1 itself trains to other parameters."""
    runs = {}
    for kind in ("approximate-r1", "r1"):
        trainer = NaiveTrainer(config(gp_kind=kind, gp_weight=100.0), *problem())
        runs[kind] = trainer.run(trainer.init(), 1)
    assert not np.allclose(runs["approximate-r1"][1]["penalty"], runs["r1"][1]["penalty"])


def test_train_flags_reach_the_config():
    args = build_parser().parse_args(
        ["train", "--gp-kind", "approximate-r1", "--gp-sigma", "0.05", "--gp-weight", "100"]
    )
    assert (args.gp_kind, args.gp_sigma, args.gp_weight) == ("approximate-r1", 0.05, 100.0)


@pytest.mark.parametrize(
    "argv",
    [
        ["check", "--gp-kind", "r2"],
        ["train", "--gp-sigma", "0"],
        ["train", "--gp-sigma", "nan"],
    ],
)
def test_bad_flags_are_refused(argv, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)
    assert "--gp-" in capsys.readouterr().err


@pytest.mark.parametrize(
    "overrides,fields",
    [
        ({"gp_sigma": 0.0}, ("gp_sigma",)),
        ({"gp_sigma": float("inf")}, ("gp_sigma",)),
        ({"second_order": "auto"}, ("gp_kind", "second_order")),
    ],
)
def test_config_refuses_what_cannot_run(overrides, fields):
    with pytest.raises(ConfigError) as err:
        config(**overrides)
    assert err.value.fields == fields
