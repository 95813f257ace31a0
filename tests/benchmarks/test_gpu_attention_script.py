"""benchmarks/gpu/attention.py, the GPU script's attention study, runs end to end here (its
``--smoke`` mode: 64 tokens on CPU), so that a lent GPU's minutes are not spent on a broken
script; and its time budget leaves what it did not reach as not measured."""

import json

import pytest

from benchmarks.gpu import attention as study


@pytest.mark.slow  # compiles and times seven ViT critic steps on CPU, and searches one capacity
def test_smoke_run_measures_every_variant_and_capacity(tmp_path):
    result = study.main(["--smoke", "--out", str(tmp_path / "attention_gpu")])
    assert {r["variant"] for r in result["rows"]} == set(study.VARIANTS)
    assert all(r["fits"] and r["step_ms"] > 0 and r["peak"] > 0 for r in result["rows"])
    assert result["capacity"] == {f"64 {study.CAPACITY[0]}": 4}  # the smoke run's cap
    written = json.loads((tmp_path / "attention_gpu.json").read_text())
    assert written["rows"] == result["rows"]
    page = (tmp_path / "attention_gpu.md").read_text()
    assert all(f"| {name} |" in page for name in study.VARIANTS)


def test_a_spent_budget_leaves_the_rest_unmeasured(tmp_path):
    result = study.main(["--smoke", "--budget-s", "0", "--out", str(tmp_path / "a")])
    assert all(r["fits"] is None for r in result["rows"])
    assert all(batch is None for batch in result["capacity"].values())
    assert "not measured" in (tmp_path / "a.md").read_text()
