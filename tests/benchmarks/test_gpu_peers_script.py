"""benchmarks/gpu/peers.py checked on CPU (its ``--smoke`` mode: 64 tokens, the Triton kernels in
interpret mode), so that a lent GPU's minutes are not spent on a broken comparison."""

from benchmarks.gpu import peers


def test_every_attention_is_measured_and_held_to_jnp(tmp_path):
    """Each attention's reverse-over-reverse step is compiled, timed and compared with jnp's (in
    bfloat16: within its rounding); a function named by --flashback joins them (here jnp's own,
    which must then agree exactly)."""
    result = peers.main(
        ["--smoke", "--flashback", "fastgp:naive_attention", "--out", str(tmp_path / "p")]
    )
    rows = {r["attention"]: r for r in result["rows"]}
    assert set(rows) == {"fastgp", "jnp", "cudnn", "flashback"}
    for row in rows.values():
        assert row["ms"] > 0 and row["peak"] > 0
        assert row["off_jnp"] < 2e-2, row
    assert rows["flashback"]["off_jnp"] == 0.0
    assert "| 64 | flashback |" in (tmp_path / "p.md").read_text()


def test_no_budget_measures_nothing(tmp_path):
    result = peers.main(["--smoke", "--budget-s", "0", "--out", str(tmp_path / "p")])
    assert all("ms" not in r and "peak" not in r for r in result["rows"])
    assert "not measured" in (tmp_path / "p.md").read_text()
