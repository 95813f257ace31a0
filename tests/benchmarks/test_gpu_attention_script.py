"""benchmarks/gpu/attention.py, the GPU script's attention study, runs end to end here (its
``--smoke`` mode: 64 tokens on CPU), so that a lent GPU's minutes are not spent on a broken
script; and its time budget leaves what it did not reach as not measured."""

import json

import pytest

from benchmarks.gpu import attention as study
from benchmarks.gpu import memory


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


def test_capacity_only_run_times_nothing(tmp_path):
    """Its budget, here none, goes to the capacity search alone (which the smoke run above
    checks)."""
    out = tmp_path / "capacity"
    result = study.main(["--smoke", "--capacity-only", "--budget-s", "0", "--out", str(out)])
    assert result["rows"] == []
    assert result["capacity"] == {f"64 {study.CAPACITY[0]}": None}
    assert (
        f"| 64 | {study.CAPACITY[0]} |  |  |  |  | not measured |"
        in (tmp_path / "capacity.md").read_text()
    )


def test_a_spent_budget_leaves_the_rest_unmeasured(tmp_path):
    result = study.main(["--smoke", "--budget-s", "0", "--out", str(tmp_path / "a")])
    assert all(r["fits"] is None for r in result["rows"])
    assert all(batch is None for batch in result["capacity"].values())
    assert "not measured" in (tmp_path / "a.md").read_text()


def _run(commit: str, rows: dict[int, list[str]], capacity: dict[str, int | None]) -> dict:
    return dict(
        argv=[commit],
        machine="m",
        commit=commit,
        device="GPU",
        rows=[dict(tokens=t, variant=v, commit=commit) for t, vs in rows.items() for v in vs],
        capacity=capacity,
    )


def test_merged_runs_keep_each_token_counts_rows_from_the_last_run_that_holds_it():
    """A run cut short at 4,096 tokens and a later run of 4,096 and 16,384: every row and capacity
    of one token count comes from one run, so a table's ratios never mix runs."""
    first = _run("a", {1024: ["x", "y"], 4096: ["x"]}, {"1024 x": 8, "4096 x": 4})
    second = _run("b", {4096: ["x", "y"], 16384: ["x", "y"]}, {"16384 x": 2})
    merged = study.merged([first, second])
    assert [(r["tokens"], r["variant"], r["commit"]) for r in merged["rows"]] == [
        (1024, "x", "a"),
        (1024, "y", "a"),
        (4096, "x", "b"),
        (4096, "y", "b"),
        (16384, "x", "b"),
        (16384, "y", "b"),
    ]
    assert merged["capacity"] == {"1024 x": 8, "16384 x": 2}  # not the first run's 4,096
    assert [run["commit"] for run in merged["runs"]] == ["a", "b"]


def test_capacity_only_runs_put_in_what_they_measured():
    """A later capacity-only run replaces or adds the capacities it found, not those it did not
    reach; its rows-less table still shows them."""
    timed = _run("a", {1024: ["x", "y"]}, {"1024 x": 8, "1024 y": 4})
    searched = _run("b", {}, {"1024 x": 16, "1024 y": None, "4096 x": 2})
    merged = study.merged([timed, searched])
    assert [r["commit"] for r in merged["rows"]] == ["a", "a"]
    assert merged["capacity"] == {"1024 x": 16, "1024 y": 4, "4096 x": 2}
    assert study.table_lines(searched)[2:] == [
        "| 1,024 | x |  |  |  |  | 16 |",
        "| 1,024 | y |  |  |  |  | not measured |",
        "| 4,096 | x |  |  |  |  | 2 |",
    ]


def test_capacity_search_compiles_only_batches_not_already_known(monkeypatch):
    """The timed batch's program was compiled for its row; the search does not compile it again,
    and it doubles until a program does not fit (here, over 40 samples' worth of memory)."""
    compiled = []

    def fake_compile(spec, variant):
        compiled.append(spec.batch)
        return None, spec.batch

    monkeypatch.setattr(study, "_compiled", fake_compile)
    monkeypatch.setattr(memory, "program_bytes", lambda batch: batch)
    monkeypatch.setattr(memory, "device_bytes", lambda: 40 / memory.HEADROOM)
    fns = study.attention_fns(smoke=True)
    found = study.largest_batch(64, "fastgp/wgan-gp", fns, 8, 256, float("inf"), {8: True})
    assert (found, compiled) == (32, [16, 32, 64])
