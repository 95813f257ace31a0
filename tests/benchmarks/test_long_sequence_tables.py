"""The long-sequence cost tables: the lazy rows are amortised from the measured ones, ratios are
over exact R1, and the largest batch is read from the compiles on record."""

import json

import pytest

from benchmarks import published
from benchmarks.approximate_r1 import tables
from benchmarks.approximate_r1.transformer_training import collapsed


def record(variant, batch, flops, bytes_, peak, fits=True, error=""):
    found = dict(generation="v5e", tokens=4096, variant=variant, batch=batch, fits=fits)
    if fits:
        found.update(flops=flops, bytes=bytes_, peak=peak)
    else:
        found["error"] = error
    return found


@pytest.fixture
def results(tmp_path):
    (tmp_path / "attention").mkdir()
    records = [
        record("flash/plain", 8, 1e12, 8e9, 2**30),
        record("flash/exact-r1", 8, 3e12, 24e9, 2 * 2**30),
        record("jax-flash/approximate-r1", 8, 2e12, 12e9, 2**30),
        record("flash/exact-r1", 16, 6e12, 48e9, 4 * 2**30),
        record("flash/exact-r1", 32, 0, 0, 0, fits=False, error="RESOURCE_EXHAUSTED: HBM"),
        record("jax-flash/approximate-r1", 16, 4e12, 24e9, 2 * 2**30),
        record("flash/approximate-r1", 8, 1.5e12, 16e9, 1.5 * 2**30),
    ]
    (tmp_path / "attention" / "attention_tpu.json").write_text(json.dumps(records))
    (tmp_path / "approximate_r1").mkdir()
    rows = [
        dict(tokens=256, batch=4, variant=v, seconds=s, temp=2**20)
        for v, s in [
            *(("fastgp/plain", 1.0), ("fastgp/exact-r1", 3.0), ("dpa/plain", 0.5)),
            *(("fastgp/approximate-r1", 2.5), ("dpa/approximate-r1", 2.0)),
        ]
    ]
    (tmp_path / "approximate_r1" / "long_sequences.json").write_text(json.dumps({"rows": rows}))
    runs = [
        dict(penalty="exact-r1", seed=0, classes_covered=10, c2st_accuracy=0.7),
        dict(penalty="exact-r1", seed=1, classes_covered=5, c2st_accuracy=0.99),
        dict(penalty="apt", seed=0, failed="exit 1"),
    ]
    training = tmp_path / "approximate_r1" / "transformer_training.json"
    training.write_text(json.dumps({"runs": runs}))
    return published.Results(tmp_path)


def cells(lines, label):
    (row,) = [line for line in lines if f"| {label} |" in line]
    return [cell.strip() for cell in row.strip("|").split("|")]


def test_tpu_rows_are_per_sample_over_exact_and_lazy_rows_amortise(results):
    lines = tables.long_tpu(results)
    exact = cells(lines, "exact R1 (fastgp flash)")
    assert exact[2:] == ["0.375", "3.00", "2.00", "1.00x, 1.00x, 1.00x", "16"]
    approximate = cells(lines, "approximate_r1 (JAX flash*)")
    assert approximate[5:] == ["0.67x, 0.50x, 0.50x", ">= 16"]  # 32 was never tried
    # every 4 steps: (3 + 3 x 1) / 4 TFLOP over 8 samples; the peak is the penalised step's
    lazy = cells(lines, "lazy exact R1 every 4 (amortised)")
    assert lazy[2:6] == ["0.188", "1.50", "2.00", "0.50x, 0.50x, 1.00x"]


def test_cpu_rows_time_each_step_over_exact_and_amortise_lazy_ones(results):
    lines = tables.long_cpu(results)
    assert cells(lines, "no penalty (dot_product_attention)")[2:4] == ["500", "0.17x"]
    assert cells(lines, "lazy exact R1 every 16 (amortised)")[2:4] == ["1,125", "0.38x"]


def test_the_answer_is_exact_over_approximate_on_each_yardstick(results):
    sentence = tables.exact_over_approximate(results)
    # flops and bytes over fastgp's approximate step, peak over JAX flash's; CPU time over the
    # faster approximate step (dot_product_attention's 2 s)
    assert "2.00x approximate_r1's flops and 1.50x its bytes" in sentence
    assert (
        "1.33x its peak memory there but 2.00x the peak of approximate_r1 through JAX's" in sentence
    )
    assert "it takes 1.50x the faster approximate step's time" in sentence
    assert sentence.endswith("exact R1 1 of 2, approximate_r1 at APT's λ = 100 1 of 1")


@pytest.mark.parametrize(
    "row, expected",
    [
        (dict(classes_covered=10, c2st_accuracy=0.7), False),
        (dict(classes_covered=7, c2st_accuracy=0.7), True),
        (dict(classes_covered=10, c2st_accuracy=0.96), True),
        (dict(failed="exit 1"), True),
    ],
)
def test_the_collapse_criterion(row, expected):
    assert collapsed(row) is expected


def test_second_order_table_marks_loop_figures_as_bounds_and_divides_by_the_plain_step():
    from benchmarks.attention import second_order

    def step(variant, batch, flops, bytes_, peak, loops=None):
        found = record(variant, batch, flops, bytes_, peak)
        return found if loops is None else {**found, "loops": loops}

    before = [
        step("flash/fastgp", 8, 2e12, 40e9, 4 * 2**30),  # no loop count: a bound
        step("flash/fastgp", 64, 16e12, 300e9, 30 * 2**30, loops=6),
        step("flash/exact-r1", 16, 1e12, 1e9, 2**30),  # not the probe batch: left out
    ]
    now = [
        step("flash/fastgp", 8, 3e12, 32e9, 3 * 2**30, loops=0),
        step("flash/fastgp", 64, 24e12, 256e9, 30 * 2**30, loops=0),
        step("flash/plain", 8, 1e12, 16e9, 2**30, loops=0),
        step("flash/exact-r1", 16, 1e12, 1e9, 2**30, loops=0),
        step("flash/reverse", 8, 3e12, 32e9, 3 * 2**30, loops=0),  # nothing before: left out
    ]
    lines = second_order.table(now, before)
    assert len(lines) == 4  # head, rule, the two WGAN-GP rows
    at_8, at_64 = lines[2], lines[3]
    assert "? → 0" in at_8 and ">= 0.25 → 0.375" in at_8 and ">= 5 → 4" in at_8
    assert "4.00 → 3.00 (0.75x)" in at_8 and "3.00x, 2.00x" in at_8
    assert "6 → 0" in at_64 and ">= 0.25 → 0.375" in at_64 and at_64.endswith("| n/a |")


def test_forgetting_a_variant_removes_its_records_from_the_list_and_the_file(tmp_path, monkeypatch):
    """``_save`` merges the records on file back in, so a forgotten record must leave the file
    too, or the next save would bring it back."""
    from benchmarks.attention import tpu

    monkeypatch.setattr(tpu, "RESULTS", tmp_path)
    monkeypatch.setattr(tpu, "RECORDS", tmp_path / "attention_tpu.json")
    records = [record("flash/plain", 8, 1, 1, 1), record("flash/fastgp", 8, 2, 2, 2)]
    tpu._save(list(records))
    removed = tpu.forget(records, {"flash/fastgp"})
    assert [r["variant"] for r in removed] == ["flash/fastgp"]
    assert [r["variant"] for r in records] == ["flash/plain"]
    tpu._save(records)
    assert [r["variant"] for r in tpu._records()] == ["flash/plain"]
