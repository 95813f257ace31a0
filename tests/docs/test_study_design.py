"""docs/study.md, the declared design, and ``benchmarks.exactness.design`` / ``analysis``, the code
that runs it, say the same: the arms, the comparisons and the numbers the analysis uses."""

import pathlib
import re

import pytest

from benchmarks.exactness import analysis, declared, design

PAGE = pathlib.Path(__file__).parents[2] / "docs" / "study.md"
TEXT = PAGE.read_text(encoding="utf-8")
GAMMA = 0.37  # any recipe weight: the arms' weights are read relative to it
SIGMA, G, LAMBDA, TIMES = (
    "\N{GREEK SMALL LETTER SIGMA}",
    "\N{GREEK SMALL LETTER GAMMA}",
    "\N{GREEK SMALL LETTER LAMDA}",
    "\N{MULTIPLICATION SIGN}",
)


def _table(first_header: str) -> list[list[str]]:
    """The rows of the markdown table whose header starts with ``| first_header |``."""
    lines = TEXT.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def _names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def test_the_arms_table_is_the_declared_arms():
    rows = {_names(r[0])[0]: r for r in _table("arm")}
    assert set(rows) == set(design.ARMS)
    for arm, (_, penalty, weight) in rows.items():
        fields = design.arm_fields(arm, GAMMA)
        assert penalty.startswith("exact") == (fields["gp_kind"] == "r1"), arm
        if fields["gp_kind"] == "approximate-r1":
            assert f"{SIGMA} = {fields['gp_sigma']:g}" in penalty, arm
        if weight == G:
            assert fields["gp_weight"] == GAMMA and fields.get("approx_scale", "r1") == "r1"
        elif weight.startswith(f"{G} / {SIGMA}"):
            assert (fields["gp_weight"], fields["approx_scale"]) == (GAMMA, "r1"), arm
        elif weight.startswith(f"{LAMBDA} = "):
            lam = float(weight.split()[2])
            assert (fields["gp_weight"], fields["approx_scale"]) == (lam, "lambda"), arm
        else:
            assert fields["gp_weight"] == pytest.approx(float(weight.split(",")[0])), arm


def test_the_comparisons_table_is_the_declared_comparisons():
    stated = []
    for name, testbed, arms, _ in _table("comparison"):
        first, *seconds = _names(arms)
        suffixes = "ab" if len(seconds) > 1 else [""]
        stated += [
            (name + s, _names(testbed)[0], first, second)
            for s, second in zip(suffixes, seconds, strict=True)
        ]
    assert stated == [tuple(c) for c in design.COMPARISONS]


def test_the_testbeds_table_is_the_declared_testbeds():
    rows = {_names(r[0])[0]: r for r in _table("testbed")}
    assert set(rows) == set(design.TESTBEDS)
    for name, (_, command, role) in rows.items():
        critic = design.TESTBEDS[name].critic
        assert ("--critic vit" in command) == (critic == "vit")
        assert role == design.TESTBEDS[name].role


@pytest.mark.parametrize(
    ("phrase", "value"),
    [
        (r"mean over its last (\d+)\s+evaluations", analysis.LAST_EVALUATIONS),
        (r"at (\d+)\s+evenly spaced points", design.EVALUATIONS),
        (r"The first (\d+) seeds of P1 and\s+P2", design.PILOT_SEEDS),
        (r"never\s+fewer than (\d+)", analysis.MIN_SEEDS),
        (r"detect a ([\d.]+)" + TIMES + r" ratio", analysis.RATIO),
        (r"at (\d+) % power", round(100 * analysis.POWER)),
        (r"About (\d+)\s+hours", design.BUDGET_HOURS),
        (r"fewer than (\d+)\s+of the 10\s+classes", analysis.MIN_CLASSES),
    ],
)
def test_the_numbers_of_the_design_are_the_code_s(phrase, value):
    match = re.search(phrase, TEXT)
    assert match is not None, phrase
    assert float(match.group(1)) == pytest.approx(value)


def test_the_runs_evaluate_as_often_as_declared():
    argv = declared.run_argv("vit", "exact", 0)
    steps = int(argv[argv.index("--steps") + 1])
    every = int(argv[argv.index("--eval-every") + 1])
    assert steps // every == design.EVALUATIONS
