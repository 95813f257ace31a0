"""The declared study's curves: geometric means over seeds per evaluated step, the seeds' range,
time from the arms' step times alone, and a run that stopped early dropping out of later steps."""

import json
import math

import numpy as np
import pytest

from benchmarks.exactness import declared_curves


def _run(arm, seed, fds):
    evaluations = [{"step": 100 * (i + 1), "frechet_distance": fd} for i, fd in enumerate(fds)]
    return {"arm": arm, "seed": seed, "evaluations": evaluations}


RESULT = {
    "testbed": "vit",
    "runs": [
        _run("exact", 0, [40.0, 20.0, 10.0]),
        _run("approx-0.01", 0, [50.0, 25.0, 16.0]),
        _run("exact", 1, [90.0, 45.0, 40.0]),
        _run("approx-0.01", 1, [60.0, 30.0]),  # stopped before its third evaluation
    ],
}


def test_each_step_is_the_geometric_mean_of_the_seeds_that_reached_it():
    c = declared_curves.curves(RESULT)
    assert list(c) == ["exact", "approx-0.01"]
    exact, approx = c["exact"], c["approx-0.01"]
    np.testing.assert_array_equal(exact.steps, [100, 200, 300])
    np.testing.assert_allclose(exact.centre, [60.0, 30.0, 20.0])  # sqrt(40*90), ...
    np.testing.assert_array_equal(exact.low, [40.0, 20.0, 10.0])
    np.testing.assert_array_equal(exact.high, [90.0, 45.0, 40.0])
    np.testing.assert_array_equal(approx.seeds, [2, 2, 1])
    assert approx.centre[-1] == pytest.approx(16.0)
    assert approx.centre[0] == pytest.approx(math.sqrt(50.0 * 60.0))


def test_minutes_come_from_the_step_time_alone():
    c = declared_curves.curves(RESULT)["exact"]
    np.testing.assert_allclose(declared_curves.minutes(c, 0.6), [1.0, 2.0, 3.0])


def test_step_times_read_the_declared_steptime_file(tmp_path):
    assert declared_curves.step_times("vit", tmp_path) is None
    runs = [{"row": "exact", "s_per_step": 0.5}, {"row": "approx-0.01", "s_per_step": 0.4}]
    (tmp_path / "steptime_declared_vit.json").write_text(json.dumps({"runs": runs}))
    assert declared_curves.step_times("vit", tmp_path) == {"exact": 0.5, "approx-0.01": 0.4}


def test_the_table_shows_each_arm_per_step_with_its_range_and_minutes():
    lines = declared_curves.table(RESULT, {"exact": 0.6})
    assert lines[0] == "| step | exact | approx-0.01 |"
    assert (
        lines[2] == "| 100 | 60.0 (40.0 to 90.0, 2 seeds), 1.0 min | 54.8 (50.0 to 60.0, 2 seeds) |"
    )
    assert lines[4].endswith("| 16.0 (16.0 to 16.0, 1 seeds) |")


@pytest.mark.parametrize("s_per_step", [None, {"exact": 0.6, "approx-0.01": 0.5}])
def test_the_figure_is_drawn_with_or_without_step_times(tmp_path, s_per_step):
    path = declared_curves.figure(RESULT, s_per_step, tmp_path / "curves.png")
    assert path.stat().st_size > 10_000


def test_the_cosine_table_groups_seeds_by_arm_step_and_sigma():
    from benchmarks.exactness import declared_cosine

    assert declared_cosine.arm_of_folder("vit-approx-0.01-12") == "approx-0.01"
    assert declared_cosine.arm_of_folder("vit-exact-0") == "exact"
    rows = [
        {
            "folder": f"vit-{arm}-{seed}",
            "step": 3500,
            "sigma": s,
            "cosine_one_draw": c,
            "ratio_one_draw": 2 * c,
        }
        for arm, seed, s, c in [
            ("exact", 0, 0.01, 0.5),
            ("exact", 1, 0.01, 0.7),
            ("exact", 0, 0.1, 0.3),
            ("approx-0.01", 0, 0.01, 0.9),
        ]
    ]
    lines = declared_cosine.table({"rows": rows})
    assert (
        lines[2] == "| approx-0.01 | 3500 | 0.01 | 1 | 0.90 (0.90 to 0.90) | 1.80 (1.80 to 1.80) |"
    )
    assert lines[3] == "| exact | 3500 | 0.01 | 2 | 0.60 (0.50 to 0.70) | 1.20 (1.00 to 1.40) |"
    assert lines[4] == "| exact | 3500 | 0.1 | 1 | 0.30 (0.30 to 0.30) | 0.60 (0.60 to 0.60) |"
