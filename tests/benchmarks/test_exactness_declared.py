"""The declared study (docs/study.md): arms that differ only in how R1 is taken, each resolving
through ``fastgp train``'s own flags to its declaration; runs that trained anything else refused;
the plan's order, resumption and the pilot's seed count on synthetic runs.

Expected configurations are built here from the recipes' constants and the design's table, not
by the runner's own functions."""

import json
import math
import subprocess
from typing import Any

import pytest

from benchmarks.exactness import analysis, declared, design
from fastgp.train.config import TrainConfig
from fastgp.train.recipes import defaults

RECIPES = {"conv": defaults.MNIST, "vit": defaults.MNIST_VIT}
SEED = 5
# How each arm takes R1 + R2 (docs/study.md's table of arms); gamma is the recipe's weight.
HOW = {
    "exact": lambda g: {"gp_kind": "r1", "gp_weight": g},
    "approx-0.01": lambda g: {
        **{"gp_kind": "approximate-r1", "gp_sigma": 0.01, "approx_scale": "r1", "gp_weight": g}
    },
    "approx-0.1": lambda g: {
        **{"gp_kind": "approximate-r1", "gp_sigma": 0.1, "approx_scale": "r1", "gp_weight": g}
    },
    "apt-approx": lambda g: {
        **{"gp_kind": "approximate-r1", "gp_sigma": 0.01, "approx_scale": "lambda"},
        "gp_weight": 100.0,
    },
    "apt-exact": lambda g: {"gp_kind": "r1", "gp_weight": 0.01},
}
PENALTY_FIELDS = {"gp_kind", "gp_sigma", "approx_scale", "gp_weight"}
CASES = [(t, a) for t in design.TESTBEDS for a in design.arms_of(t)]


def expected(testbed, arm):
    chosen = RECIPES[design.TESTBEDS[testbed].critic]
    fields = {**chosen.fields, "total_steps": chosen.steps}
    own = {"critic": design.TESTBEDS[testbed].critic, "seed": SEED, "backend": "xla"}
    config = TrainConfig(**{**fields, **own, **HOW[arm](chosen.fields["gp_weight"])})
    return json.loads(json.dumps(config.__dict__))


@pytest.mark.parametrize("testbed,arm", CASES)
def test_each_arm_resolves_to_its_declaration(testbed, arm):
    resolved = declared.resolved_run(declared.run_argv(testbed, arm, SEED))
    assert resolved == {"dataset": "mnist", "config": expected(testbed, arm)}
    declared.check_declared(testbed, arm, SEED, resolved)


@pytest.mark.parametrize("comparison", design.COMPARISONS, ids=lambda c: c.name)
def test_the_arms_of_a_comparison_differ_only_in_how_the_penalty_is_taken(comparison):
    first = declared.declared_config(comparison.testbed, comparison.first, SEED)
    second = declared.declared_config(comparison.testbed, comparison.second, SEED)
    differing = {f for f in first if first[f] != second[f]}
    assert differing and differing <= PENALTY_FIELDS


def test_the_testbeds_train_their_recipes_r1_with_r2_every_step():
    for testbed in design.TESTBEDS:
        config = declared.declared_config(testbed, "exact", SEED)
        assert (config["gp_kind"], config["gp_at"]) == ("r1", "real+fake")
        assert (config["gp_every"], config["gp_schedule"]) == (1, "constant")


def test_a_run_that_trained_something_else_is_refused_naming_the_field():
    run = {"dataset": "mnist", "config": expected("vit", "approx-0.1")}
    run["config"]["gp_schedule"] = "cosine"
    with pytest.raises(declared.UndeclaredConfig, match="gp_schedule: declared 'constant'"):
        declared.check_declared("vit", "approx-0.1", SEED, run)


def test_plan_runs_every_arm_of_a_seed_before_the_next_seed_rotating_the_first():
    plan = design.plan({"vit": 3})
    arms = design.arms_of("vit")
    assert [s for _, _, s in plan] == [0] * len(arms) + [1] * len(arms) + [2] * len(arms)
    assert [a for _, a, s in plan if s == 1] == [*arms[1:], arms[0]]
    assert {a for _, a, _ in plan} == set(arms) == {"exact", "approx-0.01", "approx-0.1"}


def _fake_run(out, testbed, arm, seed, fds, classes=10):
    """A finished run's folder: run.json as declared, metrics.jsonl and summary.json."""
    out.mkdir(parents=True)
    run = {"dataset": "mnist", "config": expected(testbed, arm), "code": [{"commit": "abc"}]}
    run["config"]["seed"] = seed
    (out / "run.json").write_text(json.dumps(run))
    lines = [
        {
            "step": 10 * (i + 1),
            "frechet_distance": fd,
            "classes_covered": classes,
            "c2st_accuracy": 0.9,
        }
        for i, fd in enumerate(fds)
    ]
    (out / "metrics.jsonl").write_text("\n".join(json.dumps(line) for line in lines))
    summary = {
        "total_steps": 10 * len(fds),
        "steps": 10 * len(fds),
        "train_s": 1.0,
        "frechet_distance": fds[-1],
        "classes_covered": classes,
        "c2st_accuracy": 0.9,
    }
    (out / "summary.json").write_text(json.dumps(summary))


def test_the_study_resumes_skipping_recorded_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(declared, "RESULTS", tmp_path)
    started = []

    def fake_train(out, argv):
        arm, seed = out.name.removeprefix("vit-").rsplit("-", 1)
        started.append((arm, int(seed)))
        _fake_run(out, "vit", arm, int(seed), [30.0, 20.0, 12.0, 10.0])
        return None

    monkeypatch.setattr(declared, "train", fake_train)
    plan = [(a, s) for _, a, s in design.plan({"vit": 2})]
    declared.run("vit", 2, tmp_path / "runs", max_runs=2)
    assert started == plan[:2]
    declared.run("vit", 2, tmp_path / "runs", max_runs=None)
    assert started == plan
    result = json.loads((tmp_path / "runs" / "declared_vit.json").read_text())
    assert [(r["arm"], r["seed"]) for r in result["runs"]] == plan
    assert not (tmp_path / "declared_vit.json").exists()  # published only by report
    assert result["runs"][0]["primary"] == pytest.approx(14.0)
    assert result["runs"][0]["collapsed"] is False


def test_a_run_that_ended_unrecorded_is_recorded_not_trained_again(tmp_path, monkeypatch):
    monkeypatch.setattr(declared, "RESULTS", tmp_path)
    arm, seed = design.plan({"vit": 1})[0][1:]
    _fake_run(tmp_path / "runs" / f"vit-{arm}-{seed}", "vit", arm, seed, [30.0, 20.0, 12.0, 10.0])
    monkeypatch.setattr(declared, "train", lambda out, argv: pytest.fail("trained again"))
    declared.run("vit", 1, tmp_path / "runs", max_runs=1)
    result = json.loads((tmp_path / "runs" / "declared_vit.json").read_text())
    assert [(r["arm"], r["seed"], r["primary"]) for r in result["runs"]] == [(arm, seed, 14.0)]


def test_a_run_a_signal_stopped_is_continued_not_recorded(tmp_path, monkeypatch):
    monkeypatch.setattr(declared, "RESULTS", tmp_path)
    arm, seed = design.plan({"vit": 1})[0][1:]
    out = tmp_path / "runs" / f"vit-{arm}-{seed}"
    _fake_run(out, "vit", arm, seed, [30.0, 20.0, 12.0])
    summary = json.loads((out / "summary.json").read_text())
    (out / "summary.json").write_text(json.dumps({**summary, "stopped_by": "SIGTERM"}))
    with pytest.raises(RuntimeError, match="stopped before its last step"):
        declared.collect(out, "vit", arm, seed, None)
    commands, real_run = [], subprocess.run

    def fake_run(command, **kwargs):
        if not command[0].endswith("fastgp"):  # git, for the results' provenance
            return real_run(command, **kwargs)
        commands.append(command)
        (out / "summary.json").write_text(json.dumps(summary))
        return subprocess.CompletedProcess(command, 0, b"", b"")

    monkeypatch.setattr(declared.subprocess, "run", fake_run)
    declared.run("vit", 1, tmp_path / "runs", max_runs=1)
    assert commands[0][-1] == "--resume"
    result = json.loads((tmp_path / "runs" / "declared_vit.json").read_text())
    assert [(r["arm"], r["seed"]) for r in result["runs"]] == [(arm, seed)]


def test_runs_of_another_recipe_are_never_pooled(tmp_path, monkeypatch):
    monkeypatch.setattr(declared, "RESULTS", tmp_path)
    old: dict[str, Any] = {"arm": "exact", "seed": 0}
    old["config"] = {**expected("vit", "exact"), "seed": 0}
    old["config"]["batch_size"] = 64  # the recipe as it was
    (tmp_path / "declared_vit.json").write_text(json.dumps({"testbed": "vit", "runs": [old]}))
    monkeypatch.setattr(declared, "train", lambda out, argv: pytest.fail("a run started"))
    with pytest.raises(declared.UndeclaredConfig, match="batch_size: declared 32, resolved 64"):
        declared.run("vit", 1, tmp_path / "runs", max_runs=None)


def test_a_log_written_twice_is_refused(tmp_path):
    out = tmp_path / "vit-exact-0"
    _fake_run(out, "vit", "exact", 0, [30.0, 20.0, 12.0, 10.0])
    lines = (out / "metrics.jsonl").read_text().splitlines()
    (out / "metrics.jsonl").write_text("\n".join([lines[0], *lines]))
    with pytest.raises(ValueError, match=r"evaluates steps \[10, 10, 20"):
        declared.collect(out, "vit", "exact", 0, None)


def test_a_collapsed_run_is_recorded_as_such(tmp_path):
    out = tmp_path / "vit-exact-0"
    _fake_run(out, "vit", "exact", 0, [30.0, 200.0, 300.0, 479.8], classes=1)
    record = declared.collect(out, "vit", "exact", 0, None)
    assert record["collapsed"] is True and record["primary"] == pytest.approx(326.6, abs=0.1)


def test_pilot_sd_and_the_seed_count_it_sets():
    runs = []
    ratios = [1.0, 1.5, 0.8, 1.2]
    for seed, r in enumerate(ratios):
        runs += [
            {"arm": "exact", "seed": seed, "primary": 10.0 * r},
            {"arm": "approx-0.01", "seed": seed, "primary": 10.0},
            {"arm": "approx-0.1", "seed": seed, "primary": 10.0 * r * r},
        ]
    sds = declared.pilot_sd({"testbed": "vit", "runs": runs})
    logs = [math.log(r) for r in ratios]
    mean = sum(logs) / 4
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 3)
    assert sds["P1"] == pytest.approx(sd) and sds["P2"] == pytest.approx(sd)
    assert analysis.seeds_needed(max(sds.values())) >= analysis.MIN_SEEDS


def test_the_report_page_renders_what_is_recorded(tmp_path, monkeypatch):
    monkeypatch.setattr(declared, "RESULTS", tmp_path)
    live = tmp_path / "runs"
    assert "nothing yet" in declared.write_report(live).read_text()
    runs = [
        {
            **{"arm": arm, "seed": s, "primary": 10.0 + s + (arm == "exact"), "collapsed": False},
            "evaluations": [{"step": 500, "frechet_distance": 10.0 + s + (arm == "exact")}],
        }
        for s in range(3)
        for arm in ("exact", "approx-0.01")
    ]
    live.mkdir()
    (live / "declared_vit.json").write_text(json.dumps({"testbed": "vit", "runs": runs}))
    page = declared.write_report(live).read_text()
    assert json.loads((tmp_path / "declared_vit.json").read_text())["runs"] == runs
    assert "vit: 6 runs" in page and "| P1 (vit) | exact / approx-0.01 | 3 |" in page
    assert "unpowered" in page
    assert "| 500 | 12.0 (11.0 to 13.0, 3 seeds) | 11.0 (10.0 to 12.0, 3 seeds) |" in page
    assert "no minutes yet" in page and (tmp_path / "declared_vit.png").exists()
    assert "gradient along the trained critics" not in page
    cosine = {"folder": "vit-exact-0", "step": 500, "sigma": 0.01}
    cosine |= {"cosine_one_draw": 0.5, "ratio_one_draw": 1.5}
    (tmp_path / "declared_cosine_vit.json").write_text(json.dumps({"rows": [cosine]}))
    (tmp_path / "steptime_declared_vit.json").write_text(
        json.dumps({"runs": [{"row": "exact", "s_per_step": 1.2}]})
    )
    page = declared.write_report(live).read_text()
    assert "| exact | 500 | 0.01 | 1 | 0.50 (0.50 to 0.50) | 1.50 (1.50 to 1.50) |" in page
    assert "| 500 | 12.0 (11.0 to 13.0, 3 seeds), 10.0 min |" in page


def test_a_non_finite_stop_is_a_collapse_scored_as_one_class_where_it_did_not_reach(tmp_path):
    out = tmp_path / "vit-exact-0"
    _fake_run(out, "vit", "exact", 0, [30.0, 20.0])
    steps = expected("vit", "exact")["total_steps"]
    every = steps // design.EVALUATIONS
    evaluation = {"frechet_distance": 10.0, "classes_covered": 10, "c2st_accuracy": 0.9}

    def evaluated(count):
        lines = [{"step": every * (i + 1), **evaluation} for i in range(count)]
        (out / "metrics.jsonl").write_text("\n".join(json.dumps(line) for line in lines))

    (out / "summary.json").unlink()
    evaluated(2)
    record = declared.collect(out, "vit", "exact", 0, "... training diverged: critic loss NaN")
    assert record["collapsed"] is True and record["nonfinite"]
    assert record["primary"] == pytest.approx(analysis.ONE_CLASS_FRECHET)
    # Stopped after its sixth evaluation: that one counts, the last two score one class.
    evaluated(6)
    record = declared.collect(out, "vit", "exact", 0, "training diverged")
    assert record["primary"] == pytest.approx((10.0 + 2 * analysis.ONE_CLASS_FRECHET) / 3)


def test_a_run_that_failed_otherwise_is_not_recorded(tmp_path):
    out = tmp_path / "vit-exact-0"
    _fake_run(out, "vit", "exact", 0, [30.0, 20.0])
    with pytest.raises(RuntimeError, match=r"not on a non-finite value.*Killed"):
        declared.collect(out, "vit", "exact", 0, "Killed")


def _primary(ratios_01, ratios_1):
    """Synthetic vit results: per seed, exact at 10 and the approximations at 10 / ratio."""
    runs = []
    for seed, (r01, r1) in enumerate(zip(ratios_01, ratios_1, strict=True)):
        runs += [
            {"arm": "exact", "seed": seed, "primary": 10.0, "collapsed": False},
            {"arm": "approx-0.01", "seed": seed, "primary": 10.0 / r01, "collapsed": False},
            {"arm": "approx-0.1", "seed": seed, "primary": 10.0 / r1, "collapsed": False},
        ]
    return {"vit": {"testbed": "vit", "runs": runs}}


def test_readme_answer_gives_no_verdict_before_ten_paired_seeds():
    from benchmarks.exactness import declared_report

    text = declared_report.answer(_primary([0.5] * 9, [0.5] * 9))
    assert text.startswith("Not known yet") and "9 of the at least 10 paired seeds" in text
    assert "0 of the at least 10" in declared_report.answer({})


def test_readme_answer_says_only_what_each_interval_allows():
    from benchmarks.exactness import declared_report

    better = [0.7, 0.72, 0.69, 0.71, 0.7, 0.73, 0.68, 0.7, 0.71, 0.7]  # exact / approx < 1
    even = [0.9, 1.1, 0.95, 1.05, 1.0, 0.92, 1.08, 0.97, 1.03, 1.0]
    text = declared_report.answer(_primary(better, even))
    first, second = text.split("; ")
    sigma = "\N{GREEK SMALL LETTER SIGMA}"
    assert f"exact R1's Fréchet distance is 0.70x that of approximate R1 at {sigma} = 0.01" in first
    assert first.endswith("exact R1 trained better generators, by that interval")
    assert "no measurable difference at this power" in second and "10 paired seeds" in second
    worse = declared_report.answer(_primary([1.4] * 10, [1.3, 1.35] * 5))
    assert worse.count("the approximation trained better generators") == 2


def test_status_counts_what_is_recorded_started_and_left(tmp_path):
    runs = tmp_path / "runs"
    plan = [(a, s) for _, a, s in design.plan({"vit": 2})]
    records = [
        {"arm": a, "seed": s, "train_s": 600.0 + 60 * i} for i, (a, s) in enumerate(plan[:3])
    ]
    runs.mkdir()
    (runs / "declared_vit.json").write_text(json.dumps({"testbed": "vit", "runs": records}))
    arm, seed = plan[3]
    (runs / f"vit-{arm}-{seed}").mkdir()
    (runs / f"vit-{arm}-{seed}" / "run.json").write_text("{}")
    got = declared.status("vit", 2, runs)
    assert (got["recorded"], got["left"], got["started"]) == (3, 3, [f"vit-{arm}-{seed}"])
    assert got["minutes_per_run"] == pytest.approx(11.0) and got["hours_left"] == 0.6
