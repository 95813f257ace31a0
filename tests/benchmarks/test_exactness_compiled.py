"""The exactness study's compiled training steps: the flags each row compiles with, the lazy row's
amortisation, and the figures on record (benchmarks/results/exactness/compiled.json)."""

import json

import pytest

from benchmarks.exactness import compiled, study

RECORD = compiled.OUT.with_suffix(".json")


def test_each_row_compiles_the_config_its_flags_train():
    lazy = compiled.config_of(compiled.argv_of("stylegan2-lazy", 49))
    assert (lazy.n_critic, lazy.gp_every, lazy.lazy_adam, lazy.gp_kind) == (1, 16, True, "r1")
    assert compiled.programs_of(lazy) == ("fused", "penalty", "no penalty")
    wgan = compiled.config_of(compiled.argv_of("wgan-gp", 196))
    assert (wgan.n_critic, wgan.gp_kind, wgan.vit_patch, wgan.batch_size) == (1, "wgan-gp", 2, 32)
    # one critic step a generator step since the mnist recipe took R3GAN's objective: one program
    assert compiled.programs_of(wgan) == ("fused",)
    r3gan = compiled.config_of(compiled.argv_of("r3gan", 49))
    assert (r3gan.loss, r3gan.gp_at, r3gan.gp_schedule, r3gan.vit_patch) == (
        "relativistic",
        "real+fake",
        "cosine",
        4,
    )
    assert r3gan.backend == "auto" and compiled.programs_of(r3gan) == ("fused",)


def test_the_lazy_step_is_amortised_over_its_interval():
    config = compiled.config_of(compiled.argv_of("stylegan2-lazy", 49))
    figures = {
        "penalty": {"flops": 32.0, "bytes": 16.0, "roofline_s": 1.6},
        "no penalty": {"flops": 16.0, "bytes": 0.0, "roofline_s": 0.0},
        "fused": {"flops": 32.0, "bytes": 8.0, "roofline_s": 1.0},
    }
    step = compiled.per_step(config, figures)
    assert step["flops"] == pytest.approx(17.0) and step["bytes"] == pytest.approx(1.0)
    assert step["roofline_s"] == pytest.approx(0.1)


@pytest.fixture(scope="module")
def record():
    if not RECORD.exists():
        pytest.skip(f"no {RECORD.name}: run python -m benchmarks.exactness.compiled")
    return json.loads(RECORD.read_text())


def _steps(record):
    return {(e["row"], e["tokens"]): e for e in record["rows"] if "step" in e}


def test_the_record_has_every_row_at_both_token_counts(record):
    steps = _steps(record)
    assert set(steps) == {(row, t) for row in study.ROWS for t in compiled.PATCHES}
    for entry in steps.values():
        for figures in entry["compiles"].values():
            assert figures["flops"] > 0 and figures["bytes"] > 0 and figures["compile_s"] > 0
        assert entry["step"]["flops"] > 0 and entry["step"]["bytes"] > 0


def test_exact_rows_cost_more_than_their_approximate_counterparts(record):
    steps = _steps(record)
    for tokens in compiled.PATCHES:
        flops = {row: steps[row, tokens]["step"]["flops"] for row in study.ROWS}
        # R1 + R2 on the relativistic loss; the two approximate rows differ in weight only.
        assert flops["r3gan"] > flops["apt-r1r2"]
        assert flops["apt-r1r2"] == pytest.approx(flops["eps2-r1r2"], rel=1e-3)
        # R1 on the non-saturating loss: the lazy row's penalty step against APT's every step.
        lazy = steps["stylegan2-lazy", tokens]["compiles"]
        assert lazy["penalty"]["flops"] > flops["apt"] > lazy["no penalty"]["flops"]
        assert lazy["no penalty"]["flops"] < flops["stylegan2-lazy"] < lazy["penalty"]["flops"]


def test_figures_grow_with_the_tokens_and_the_critic_steps(record):
    steps = _steps(record)
    for row in study.ROWS:
        assert steps[row, 196]["step"]["flops"] > steps[row, 49]["step"]["flops"]
    for tokens in compiled.PATCHES:
        wgan = steps["wgan-gp", tokens]["compiles"]
        # The fused run's cost counts its scan over 3 critic steps once.
        assert wgan["written-out"]["flops"] > 1.5 * wgan["fused"]["flops"]
        assert wgan["fused"]["loops"] >= 1 and wgan["written-out"]["loops"] == 0
