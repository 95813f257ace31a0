"""The declared study's statistics on small synthetic inputs, against published values and
closed forms."""

import math

import numpy as np
import pytest

from benchmarks.exactness import analysis


def _evals(*fds, classes=10):
    return [{"frechet_distance": fd, "classes_covered": classes} for fd in fds]


def test_primary_metric_is_the_mean_of_the_last_three():
    assert analysis.primary_metric(_evals(90.0, 5.0, 6.0, 7.0)) == pytest.approx(6.0)
    with pytest.raises(ValueError, match="needs 3 evaluations"):
        analysis.primary_metric(_evals(5.0, 6.0))


@pytest.mark.parametrize(
    ("run", "expected"),
    [
        ({"evaluations": _evals(9.0, 8.0)}, False),
        ({"evaluations": _evals(9.0, 8.0, classes=7)}, True),
        ({"evaluations": _evals(9.0, 181.9)}, True),
        ({"evaluations": _evals(9.0, float("nan"))}, True),
        ({"evaluations": _evals(9.0, 8.0), "nonfinite": "critic loss at step 40"}, True),
    ],
)
def test_collapse_is_the_declared_event(run, expected):
    assert analysis.collapsed(run) is expected


def test_wilson_matches_hand_worked_intervals():
    # Wilson's closed form worked by hand to four decimals (z = 1.96).
    assert analysis.wilson(1, 3) == pytest.approx((0.0615, 0.7923), abs=1e-4)
    assert analysis.wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    low, high = analysis.wilson(0, 10)
    assert low == pytest.approx(0.0, abs=1e-12) and high == pytest.approx(0.2775, abs=1e-4)
    with pytest.raises(ValueError):
        analysis.wilson(4, 3)


def test_sign_test_is_the_exact_binomial():
    assert analysis.sign_test(0, 6) == pytest.approx(2 / 64)
    assert analysis.sign_test(1, 5) == pytest.approx(2 * 7 / 64)
    assert analysis.sign_test(3, 3) == 1.0
    assert analysis.sign_test(0, 0) == 1.0


def test_paired_ratio_is_the_geometric_mean_with_a_bootstrap_interval():
    b = np.array([10.0, 20.0, 5.0, 8.0, 12.0, 30.0])
    factors = np.array([0.5, 2.0, 0.9, 1.1, 0.7, 1.6])
    ratio, low, high = analysis.paired_ratio(b * factors, b)
    assert ratio == pytest.approx(math.exp(np.mean(np.log(factors))))
    assert low < ratio < high
    # an independent bootstrap of the same draws
    rng = np.random.default_rng(0)
    logs = np.log(factors)
    means = logs[rng.integers(0, 6, (10_000, 6))].mean(1)
    assert (low, high) == pytest.approx(tuple(np.exp(np.percentile(means, [2.5, 97.5]))))
    same = analysis.paired_ratio(2 * b, b)
    assert same == pytest.approx((2.0, 2.0, 2.0))
    with pytest.raises(ValueError, match="positive"):
        analysis.paired_ratio([1.0, 0.0], [1.0, 1.0])
    with pytest.raises(ValueError, match="equal lists"):
        analysis.paired_ratio([1.0, 2.0], [1.0])


def test_seed_count_from_the_pilot_sd():
    # ((1.959964 + 0.841621) * 0.3 / ln 1.25)^2 = 14.19 -> 15
    assert analysis.seeds_needed(0.3) == 15
    assert analysis.seeds_needed(0.05) == analysis.MIN_SEEDS
    for s in (0.3, 0.6, 1.0):  # past the 10-seed floor
        n = analysis.seeds_needed(s)
        assert (
            analysis.detectable_ratio(s, n) <= analysis.RATIO < analysis.detectable_ratio(s, n - 1)
        )


@pytest.mark.parametrize(
    ("low", "high", "expected"),
    [(0.6, 0.9, "lower"), (1.1, 1.4, "higher"), (0.8, 1.2, "no measurable difference")],
)
def test_verdict_follows_the_interval(low, high, expected):
    assert analysis.verdict(low, high) == expected


def _run(arm, seed, primary, collapsed=False):
    return {"arm": arm, "seed": seed, "primary": primary, "collapsed": collapsed}


def test_the_report_pairs_seeds_and_draws_a_verdict_only_when_powered():
    from benchmarks.exactness import declared_report

    exact = [10.0, 12.0, 9.0, 11.0, 10.5, 9.5, 12.5, 10.0, 11.5, 9.0, 10.0]
    runs = [_run("exact", s, v) for s, v in enumerate(exact)]
    runs += [_run("approx-0.01", s, 2 * v) for s, v in enumerate(exact[:10])]
    runs += [_run("approx-0.1", s, v, collapsed=s == 0) for s, v in enumerate(exact[:3])]
    rows = {r["comparison"]: r for r in declared_report.comparison_rows({"vit": {"runs": runs}})}
    assert set(rows) == {"P1", "P2"}
    p1, p2 = rows["P1"], rows["P2"]
    assert p1["seeds"] == 10 and p1["ratio"] == pytest.approx((0.5, 0.5, 0.5))
    assert p1["verdict"] == "lower"
    assert p2["seeds"] == 3 and p2["verdict"] == "unpowered"
    assert p2["collapsed"] == [0, 1] and p2["sign_test_p"] == 1.0
    assert p2["ratio_without_collapses"] == pytest.approx((1.0, 1.0, 1.0))
    lines = declared_report.markdown({"vit": {"runs": runs}})
    assert len(lines) == 4 and "P1 (vit)" in lines[2] and "unpowered" in lines[3]
