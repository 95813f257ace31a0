"""benchmarks/gpu/sweep.py checked on CPU (its ``--smoke`` mode: the Triton kernels in interpret
mode at 64 tokens), so that a lent GPU's minutes are not spent on a broken sweep."""

import json

import pytest

from benchmarks.gpu import sweep
from fastgp._gpu import tuned as _gpu_tuned


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    return sweep.main(["--smoke", "--out", str(out)]), out


def test_every_pass_and_candidate_is_timed_and_the_fastest_tabled(smoke):
    result, out = smoke
    timed = {(r["pass"], r["block"]) for r in result["attention"] if "seconds" in r}
    assert timed == {(name, c.block) for name in sweep.PASSES for c in sweep.SMOKE_CANDIDATES}
    row = json.loads((out / "gpu_tuned.json").read_text())[result["device"]]
    for name in sweep.PASSES:
        fastest = min(
            (r for r in result["attention"] if r["pass"] == name), key=lambda r: r["seconds"]
        )
        assert _gpu_tuned.Launch(**row["attention"][name]["16"]).block == fastest["block"]
    totals = {
        p: sum(r["seconds"] for r in result["penalty"] if r["programs_per_sm"] == p)
        for p in sweep.PROGRAMS_PER_SM
    }
    assert row["penalty"]["programs_per_sm"] == min(totals, key=totals.__getitem__)
    assert "| second_vjp | 16 |" in (out / "gpu_sweep.md").read_text()


def test_a_launch_whose_results_differ_is_left_out(tmp_path, monkeypatch):
    """A candidate is held to the default launch's results: where none agrees (here no
    agreement is accepted), each is left out saying so, and the table gets no launch."""
    monkeypatch.setattr(sweep, "AGREEMENT", -1.0)
    result = sweep.main(["--smoke", "--budget-s", "1", "--out", str(tmp_path)])
    assert result["attention"], "the first pass runs within any budget"
    assert all("differs from the default launch" in r["error"] for r in result["attention"])
    row = json.loads((tmp_path / "gpu_tuned.json").read_text())[result["device"]]
    assert row["attention"] == {}


def test_no_budget_sweeps_no_pass(tmp_path):
    result = sweep.main(["--smoke", "--budget-s", "0", "--out", str(tmp_path)])
    assert result["attention"] == []
    assert "Launches left out: 0." in (tmp_path / "gpu_sweep.md").read_text()
