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
