"""benchmarks/tpu/versions.py: a TPU results file holds each JAX's records; pages render the
oldest's and name every figure a newer JAX compiled otherwise."""

import json

from benchmarks.tpu import versions


def record(jax, variant, flops, **extra):
    return {"jax": jax, "libtpu": f"lib-{jax}", "variant": variant, "flops": flops, **extra}


KEY = lambda r: (r["variant"],)
FIGURES = {"flops": lambda r: f"{r['flops']:.1f}"}


def test_a_rerun_replaces_its_own_toolchain_only_and_the_oldest_comes_first(tmp_path):
    path = tmp_path / "figures.json"
    path.write_text(json.dumps([record("0.12.0.1", "a", 1.0), record("0.10.2", "a", 2.0)]))
    again = versions.merged(path, [record("0.12.0.1", "a", 3.0), record("0.12.0.1", "b", 4.0)])
    assert [(r["jax"], r["flops"]) for r in again] == [
        ("0.10.2", 2.0),
        ("0.12.0.1", 3.0),
        ("0.12.0.1", 4.0),
    ]
    assert versions.merged(tmp_path / "new.json", again[:1]) == again[:1]


def test_the_oldest_is_compared_as_numbers_not_text():
    records = [record("0.10.2", "a", 1.0), record("0.9.1", "a", 2.0)]
    assert versions.of_oldest(records) == [records[1]]


def test_differences_name_each_changed_figure_and_only_those():
    records = [
        record("0.10.2", "a", 1.0),
        record("0.10.2", "b", 2.0),
        record("0.12.0.1", "a", 1.0),
        record("0.12.0.1", "b", 2.5),
        record("0.12.0.1", "c", 9.0),
    ]
    lines = versions.differences(records, KEY, FIGURES)
    assert lines[0] == "Compiled with JAX 0.10.2, libtpu lib-0.10.2."
    text = "\n".join(lines)
    assert "| b | flops | 2.0 | 2.5 |" in text
    assert "| a |" not in text
    assert "of the same 2 programs that differ" in text
    assert "Compiled with JAX 0.12.0.1 only: c." in text


def test_equal_figures_say_so():
    records = [record("0.10.2", "a", 1.0), record("0.12.0.1", "a", 1.04)]
    lines = versions.differences(records, KEY, FIGURES)
    assert (
        lines[-1]
        == "With JAX 0.12.0.1, libtpu lib-0.12.0.1: every figure of the same 1 program equal."
    )
    assert versions.differences(records[:1], KEY, FIGURES) == [
        "Compiled with JAX 0.10.2, libtpu lib-0.10.2."
    ]


def test_the_summary_counts_the_programs_each_figure_differs_in():
    records = [
        record("0.10.2", "a", 1.0, temp=0.0),
        record("0.10.2", "b", 2.0, temp=0.0),
        record("0.12.0.1", "a", 1.0, temp=3.0),
        record("0.12.0.1", "b", 2.0, temp=0.0),
    ]
    figures = {**FIGURES, "temp": lambda r: f"{r['temp']:.1f}"}
    assert versions.summary(records, KEY, figures) == (
        "Compiled with JAX 0.10.2, libtpu lib-0.10.2. With JAX 0.12.0.1, libtpu lib-0.12.0.1, of "
        "the same 2 programs: flops equal in every one; differing: temp in 1."
    )
    assert versions.summary(records[:2], KEY, figures) == (
        "Compiled with JAX 0.10.2, libtpu lib-0.10.2."
    )
