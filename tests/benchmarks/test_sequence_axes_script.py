"""benchmarks/attention/sequence_axes.py on a short sequence: every row compiled, the split's
program holding its all-to-alls beside the ring's permutes, and the table read from the rows."""

from benchmarks.attention import sequence_axes


def test_a_short_run_compiles_both_splits_and_tabulates_them(tmp_path):
    out = tmp_path / "axes"
    result = sequence_axes.main(["--tokens", "256", "--shards", "4", "--out", str(out)])
    rows = {(r["program"], r["split"]): r for r in result["rows"]}
    assert len(rows) == 4 == len(result["rows"])
    for program in ("gradient", "reverse-over-forward"):
        ring, split = rows[(program, "ring")], rows[(program, "all-to-all then ring")]
        assert set(ring["collectives"]) == {"collective-permute"}
        assert set(split["collectives"]) == {"all-to-all", "collective-permute"}
        assert ring["one_device"] == split["one_device"] > 0
    lines = sequence_axes.table(result)
    assert len(lines) == 4 and lines[2].startswith("| 256 | gradient | 4 |")
    ratio = rows[("gradient", "all-to-all then ring")]["temp"] / rows[("gradient", "ring")]["temp"]
    assert lines[2].split(" | ")[5] == f"{ratio:.2f}"
    assert out.with_suffix(".md").read_text().count("| 256 |") == 2


def test_the_tpu_table_reads_each_split_s_peak():
    row = lambda n, split, gib: dict(
        tokens=65536, shards=n, split=split, peak=gib * 2**30, collectives={"all-to-all": 11}
    )
    result = dict(
        traded=4,
        rows=[
            row(8, "ring", 0.2),
            row(8, "all-to-all then ring", 0.17),
            row(16, "ring", 0.1),
            row(16, "all-to-all then ring", 0.11),
        ],
    )
    lines = sequence_axes.tpu_table(result)
    assert lines[2] == "| 65,536 | 8 | 0.200 | 0.170 | 0.85 | all-to-all 11 |"
    assert lines[3] == "| 65,536 | 16 | 0.100 | 0.110 | 1.10 | all-to-all 11 |"
