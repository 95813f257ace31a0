"""The declared study of docs/study.md, as code: its testbeds, arms, comparisons, evaluation
cadence, seeds and budget. Written before its runs; the study runs it unchanged.

    TESTBEDS[name]     -> Testbed(critic, role): the mnist recipe of that critic
    arm_fields(arm, weight) -> the TrainConfig fields an arm sets, given the recipe's R1 weight
    COMPARISONS        -> (Comparison(name, testbed, first, second), ...), in budget order
    plan(seeds_of)     -> [(testbed, arm, seed)] in the order the runs execute
"""

from typing import Any, NamedTuple

DATASET = "mnist"
BACKEND = "xla"  # the CPU's; every run names it, so that no default decides it
EVALUATIONS = 8  # evenly spaced evaluations per run; the primary metric takes the last 3
PILOT_SEEDS = 4  # the first seeds of P1 and P2, whose paired sd sets the seed count
BUDGET_HOURS = 12.0  # one-run-at-a-time compute, all comparisons together
SIGMAS = (0.01, 0.1)  # APT's images; APT's video and FastGen
APT_LAMBDA, APT_SIGMA = 100.0, 0.01


class Testbed(NamedTuple):
    """A recipe the study trains: ``fastgp train --dataset mnist --critic CRITIC``."""

    critic: str
    role: str


TESTBEDS = {"vit": Testbed("vit", "primary"), "conv": Testbed("conv", "secondary")}


def arm_fields(arm: str, weight: float) -> dict[str, Any]:
    """The ``TrainConfig`` fields ``arm`` sets; every other field is its testbed's recipe's.
    ``weight`` is the recipe's R1 weight gamma. KeyError for an arm not declared."""
    approximate = {"gp_kind": "approximate-r1", "approx_scale": "r1", "gp_weight": weight}
    arms = {
        "exact": {"gp_kind": "r1", "gp_weight": weight},
        **{f"approx-{s:g}": {**approximate, "gp_sigma": s} for s in SIGMAS},
        "apt-approx": {
            **{"gp_kind": "approximate-r1", "approx_scale": "lambda"},
            **{"gp_weight": APT_LAMBDA, "gp_sigma": APT_SIGMA},
        },
        "apt-exact": {"gp_kind": "r1", "gp_weight": APT_LAMBDA * APT_SIGMA**2},
    }
    return arms[arm]


ARMS = ("exact", "approx-0.01", "approx-0.1", "apt-approx", "apt-exact")


class Comparison(NamedTuple):
    """``first`` against ``second`` on ``testbed``, over the same seeds."""

    name: str
    testbed: str
    first: str
    second: str


COMPARISONS = (
    Comparison("P1", "vit", "exact", "approx-0.01"),
    Comparison("P2", "vit", "exact", "approx-0.1"),
    Comparison("S1a", "conv", "exact", "approx-0.01"),
    Comparison("S1b", "conv", "exact", "approx-0.1"),
    Comparison("S2", "conv", "apt-exact", "apt-approx"),
)


def arms_of(testbed: str) -> tuple[str, ...]:
    """The arms ``testbed`` runs, in the order of the comparisons that name them."""
    seen: dict[str, None] = {}
    for c in COMPARISONS:
        if c.testbed == testbed:
            seen.update(dict.fromkeys((c.first, c.second)))
    return tuple(seen)


def plan(seeds_of: dict[str, int]) -> list[tuple[str, str, int]]:
    """(testbed, arm, seed) of every run, in execution order: testbed by testbed as
    ``seeds_of`` lists them (testbed -> seed count), seed by seed, the arms of a seed rotated
    by the seed so that no arm always runs first."""
    runs = []
    for testbed, seeds in seeds_of.items():
        arms = arms_of(testbed)
        for seed in range(seeds):
            shift = seed % len(arms)
            runs += [(testbed, arm, seed) for arm in arms[shift:] + arms[:shift]]
    return runs


__all__ = [
    "ARMS",
    "BACKEND",
    "BUDGET_HOURS",
    "COMPARISONS",
    "Comparison",
    "DATASET",
    "EVALUATIONS",
    "PILOT_SEEDS",
    "TESTBEDS",
    "Testbed",
    "arm_fields",
    "arms_of",
    "plan",
]
