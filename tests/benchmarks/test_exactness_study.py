"""The exactness study's arms are what they declare: each row of both critics resolves, through
``fastgp train``'s own flags and recipes, to the base recipe with the row's fields and nothing
else; a run that trained anything else is refused with the fields that differ; runs without a
resolved configuration are never pooled with runs that keep one.

The expected configurations are built here from the recipes' constants (``MNIST``, ``MNIST_VIT``)
and each arm's fields, not by the study's own functions."""

import copy
import json
import pathlib

import pytest

from benchmarks.exactness import report, study
from fastgp.train.config import TrainConfig
from fastgp.train.recipes import defaults

BASE = {"conv": defaults.MNIST.fields, "vit": defaults.MNIST_VIT.fields}
STEPS, SEED = 123, 7
RESULTS = pathlib.Path(study.RESULTS)
# The flags each row has always passed (benchmarks/results/exactness/study_*.json record them).
ROW_FLAGS = {
    "r3gan": "--loss relativistic --gp-at real+fake --n-critic 1 --gp-kind r1 --gp-weight 1 "
    "--gp-schedule cosine --gp-weight-final 0.1",
    "apt-r1r2": "--loss relativistic --gp-at real+fake --n-critic 1 --gp-kind approximate-r1 "
    "--gp-sigma 0.01 --gp-weight 100",
    "eps2-r1r2": "--loss relativistic --gp-at real+fake --n-critic 1 --gp-kind approximate-r1 "
    "--gp-sigma 0.01 --approx-scale r1 --gp-weight 1",
    "stylegan2-lazy": "--loss non-saturating --n-critic 1 --gp-kind r1 --gp-weight 1 "
    "--gp-every 16 --lazy-adam",
    "apt": "--loss non-saturating --n-critic 1 --gp-kind approximate-r1 --gp-sigma 0.01 "
    "--gp-weight 100",
    "wgan-gp": "--gp-kind wgan-gp",
}
ARMS = [(critic, row) for critic in BASE for row in study.ROWS]


def expected(critic, row):
    """The run of ``row`` as declared: the base recipe, the run's own fields, the row's."""
    arm = study.arms(1.0)[row]
    own = {"critic": critic, "seed": SEED, "total_steps": STEPS, "backend": "xla"}
    config = TrainConfig(**{**BASE[critic], **own, **arm})
    return json.loads(json.dumps(config.__dict__))


def test_each_row_passes_the_flags_it_always_passed():
    assert study.rows(1.0) == {row: flags.split() for row, flags in ROW_FLAGS.items()}


@pytest.mark.parametrize("critic,row", ARMS)
def test_each_arm_resolves_to_its_declaration(critic, row):
    """What ``fastgp train`` makes of the run's flags is the base recipe with the arm's fields:
    no field the arm does not declare (a loss recipe's cosine schedule) comes from elsewhere."""
    arm = study.arms(1.0)[row]
    resolved = study.resolved_run(study.run_argv(critic, arm, SEED, STEPS))
    assert resolved == {"dataset": "mnist", "config": expected(critic, row)}
    config = resolved["config"]
    if "gp_schedule" not in arm:
        assert (config["gp_schedule"], config["gp_weight_final"]) == ("constant", None)
    study.check_declared(row, critic, arm, SEED, STEPS, resolved)


def _leaky_default_config(dataset, recipe_name=None, **overrides):
    """default_config as it was: a loss with a recipe of its own starts from that recipe."""
    named = {"relativistic": "r3gan"}.get(overrides.get("loss") or "")
    if recipe_name is None and (dataset, overrides.get("critic"), named) in defaults.NAMED_RECIPES:
        recipe_name = named
    return defaults.default_config(dataset, recipe_name, **overrides)


def test_a_loss_recipe_leaking_into_an_approximate_arm_is_refused(monkeypatch):
    """Were a loss to bring in its recipe again, the approximate R1 + R2 arm would train on the
    recipe's cosine schedule: the study refuses it, naming the fields."""
    from fastgp.train.run import resolve as run_config

    monkeypatch.setattr(run_config, "default_config", _leaky_default_config)
    arm = study.arms(1.0)["apt-r1r2"]
    resolved = study.resolved_run(study.run_argv("vit", arm, SEED, STEPS))
    with pytest.raises(study.UndeclaredConfig) as refused:
        study.check_declared("apt-r1r2", "vit", arm, SEED, STEPS, resolved)
    assert ("gp_schedule", "constant", "cosine") in refused.value.differences
    assert ("gp_weight_final", None, 0.1) in refused.value.differences
    # The exact arm declares that schedule itself, so the same leak leaves it as declared.
    r3gan = study.arms(1.0)["r3gan"]
    r3gan_run = study.resolved_run(study.run_argv("vit", r3gan, SEED, STEPS))
    study.check_declared("r3gan", "vit", r3gan, SEED, STEPS, r3gan_run)


def test_the_refusal_names_each_field_declared_and_resolved():
    arm = study.arms(1.0)["apt"]
    run = {"dataset": "mnist", "config": expected("conv", "apt")}
    run["config"].update(gp_schedule="cosine", gp_weight_final=0.1, lr_d=1e-3)
    with pytest.raises(study.UndeclaredConfig) as refused:
        study.check_declared("apt, seed 7", "conv", arm, SEED, STEPS, run)
    assert refused.value.differences == [
        ("lr_d", defaults.MNIST.fields["lr_d"], 1e-3),
        ("gp_schedule", "constant", "cosine"),
        ("gp_weight_final", None, 0.1),
    ]
    message = str(refused.value)
    assert message.startswith("apt, seed 7: the resolved configuration is not the arm's")
    assert "gp_schedule: declared 'constant', resolved 'cosine'" in message
    assert "gp_weight_final: declared None, resolved 0.1" in message
    assert "lr_d: declared 0.0002, resolved 0.001" in message
    with pytest.raises(study.UndeclaredConfig, match="dataset: declared 'mnist', resolved"):
        study.check_declared("apt", "conv", arm, SEED, STEPS, {**run, "dataset": "digits"})


def test_a_value_without_a_short_form_reaches_its_flag_exactly():
    flags = study.flags_of({"gp_weight": 1 / 3, "gp_every": 4, "lazy_adam": True})
    assert flags == ["--gp-weight", repr(1 / 3), "--gp-every", "4", "--lazy-adam"]
    assert float(flags[1]) == 1 / 3


class _FinishedRun:
    """A ``fastgp train`` process that has already ended, having written ``run.json``."""

    returncode = 0

    def __init__(self, command, run, **_):
        out = pathlib.Path(command[command.index("--out") + 1])
        out.mkdir(parents=True)
        (out / "run.json").write_text(json.dumps(run))

    def poll(self):
        return 0

    def communicate(self):
        return b"", b""


def test_a_run_is_checked_from_its_own_run_json_before_it_is_kept(monkeypatch, tmp_path):
    """run_one reads what the run recorded: a run.json whose configuration is not the arm's is
    refused before anything of the run is kept."""
    arm = study.arms(1.0)["apt-r1r2"]
    steps = int(300 / 1.5)
    leaked = {"dataset": "mnist", "recipe": None, "config": expected("vit", "apt-r1r2")}
    leaked["config"].update(seed=0, total_steps=steps, gp_schedule="cosine", gp_weight_final=0.1)
    leaked["code"] = [{"commit": "a" * 40, "dirty": False, "from_step": 0}]
    monkeypatch.setattr(
        study.subprocess, "Popen", lambda command, **kw: _FinishedRun(command, leaked)
    )
    with pytest.raises(study.UndeclaredConfig, match="gp_schedule: declared 'constant'"):
        study.run_one("vit", "apt-r1r2", arm, 0, 1.5, 300, tmp_path, "t")


def _run(row, recorded, frechet=50.0, **extra):
    run = {"row": row, "critic": "vit", "seed": 0, "flags": ["--dataset", "mnist"] * 4}
    run.update(steps=10, s_per_step=1.0, c2st_accuracy=0.9, frechet_distance=frechet)
    run.update(classes_covered=10, collapsed=False, arm={"gp_kind": "r1"})
    run.update(extra)
    if recorded:
        run.update(config={"gp_kind": "r1"}, commit="0123456789abcdef", dirty=True)
    return run


def test_runs_without_a_resolved_configuration_are_never_pooled():
    """Old runs (no ``config``) are summarised apart, marked, and refuse new company."""
    runs = [_run("r3gan", False, 40.0), _run("r3gan", True, 60.0), _run("r3gan", True, 80.0)]
    result = {"machine": "m", "invocations": [[]], "runs": runs}
    old, new = report.summarize(result)
    assert (old["recorded"], old["frechet"]) == (False, [40.0])
    assert (new["recorded"], new["frechet"]) == (True, [60.0, 80.0])
    table = report.summary_table(result)
    assert table[2].startswith("| r3gan \N{DAGGER} | 0 of 1 |")
    assert table[3].startswith("| r3gan | 0 of 2 |")
    assert table[-1] == report.unrecorded_note(1) and table[-1].startswith("\N{DAGGER} 1 run ")
    with pytest.raises(ValueError, match="row r3gan holds runs with and without"):
        report.by_row(report.summarize(result))
    page = report.markdown(result)
    assert "| not recorded |" in page and "| 012345678 (dirty) |" in page
    with pytest.raises(ValueError, match="without their resolved configuration"):
        study.admit(result, _run("r3gan", True))


def test_a_row_is_pooled_only_with_runs_declared_alike():
    result = {"runs": [_run("r3gan", True)]}
    study.admit(result, _run("r3gan", True))
    study.admit(result, _run("apt", True, arm={"gp_kind": "approximate-r1"}))
    with pytest.raises(ValueError, match="r3gan: the results' earlier runs of this row"):
        study.admit(result, _run("r3gan", True, arm={"gp_kind": "r1", "gp_weight": 2.0}))


@pytest.mark.parametrize("critic", ["vit", "conv"])
def test_the_recorded_results_render_with_their_runs_marked(critic):
    """The results on record predate each run's configuration: every row renders, marked."""
    path = RESULTS / f"study_{critic}.json"
    result = json.loads(path.read_text())
    if all(report.recorded(run) for run in result["runs"]):
        pytest.skip(f"{path.name} keeps every run's configuration")
    table = report.summary_table(copy.deepcopy(result))
    rows = [line for line in table if line.startswith("| ") and not line.startswith("| row")]
    unrecorded = {run["row"] for run in result["runs"] if not report.recorded(run)}
    marked = {
        line.split(" | ")[0][2:].removesuffix(" \N{DAGGER}")
        for line in rows
        if "\N{DAGGER}" in line
    }
    count = sum(not report.recorded(run) for run in result["runs"])
    assert marked == unrecorded and table[-1] == report.unrecorded_note(count)
