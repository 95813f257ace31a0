"""The run's figure.png names what the run trained: its penalty, the points the norms are taken
at, the reference line (WGAN-GP's and LP's target, 0 for R1 and R2) and the loss curves. The
expected labels are written out here per kind, placement and loss, not derived from the module."""

from typing import Any

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import pytest

from fastgp.train.config import TRAIN_KINDS, ConfigError, TrainConfig
from fastgp.train.objective.losses import LOSSES
from fastgp.train.objective.penalties import PLACEMENTS
from fastgp.train.recipes.defaults import build_problem, default_config
from fastgp.train.run import figures
from fastgp.train.run.evaluation import Evaluator
from fastgp.train.trainers.state import init_state

SIGMA, MINUS = "\N{GREEK SMALL LETTER SIGMA}", "\N{MINUS SIGN}"
INTERPOLATES, REALS, FAKES = "the interpolates", "the reals", "the fakes"
# (gp_kind, gp_at, gp_target, gp_sigma) -> (penalty, points, where, reference, reference label)
PENALTIES = {
    ("wgan-gp", None, 1.0, 0.01): ("WGAN-GP", ("interpolates",), INTERPOLATES, 1.0, "target 1"),
    ("wgan-gp", "interpolates", 2.0, 0.01): (
        "WGAN-GP",
        ("interpolates",),
        INTERPOLATES,
        2.0,
        "target 2",
    ),
    ("wgan-gp", "real", 1.0, 0.01): ("WGAN-GP at the reals", ("real",), REALS, 1.0, "target 1"),
    ("wgan-gp", "fake", 1.0, 0.01): ("WGAN-GP at the fakes", ("fake",), FAKES, 1.0, "target 1"),
    ("wgan-gp", "real+fake", 1.0, 0.01): (
        "WGAN-GP at the reals and the fakes",
        ("real", "fake"),
        "the reals and the fakes",
        1.0,
        "target 1",
    ),
    ("wgan-lp", None, 1.0, 0.01): (
        "WGAN-LP",
        ("interpolates",),
        INTERPOLATES,
        1.0,
        "target 1 (penalised above it)",
    ),
    ("wgan-lp", "interpolates", 1.0, 0.01): (
        "WGAN-LP",
        ("interpolates",),
        INTERPOLATES,
        1.0,
        "target 1 (penalised above it)",
    ),
    ("wgan-lp", "real", 1.5, 0.01): (
        "WGAN-LP at the reals",
        ("real",),
        REALS,
        1.5,
        "target 1.5 (penalised above it)",
    ),
    ("wgan-lp", "fake", 1.0, 0.01): (
        "WGAN-LP at the fakes",
        ("fake",),
        FAKES,
        1.0,
        "target 1 (penalised above it)",
    ),
    ("wgan-lp", "real+fake", 1.0, 0.01): (
        "WGAN-LP at the reals and the fakes",
        ("real", "fake"),
        "the reals and the fakes",
        1.0,
        "target 1 (penalised above it)",
    ),
    ("r1", None, 1.0, 0.01): ("R1", ("real",), REALS, 0.0, "target 0"),
    ("r1", "real", 1.0, 0.01): ("R1", ("real",), REALS, 0.0, "target 0"),
    ("r1", "fake", 1.0, 0.01): ("R2", ("fake",), FAKES, 0.0, "target 0"),
    ("r1", "real+fake", 1.0, 0.01): (
        "R1 + R2",
        ("real", "fake"),
        "the reals and the fakes",
        0.0,
        "target 0",
    ),
    ("r1", "interpolates", 1.0, 0.01): (
        "zero-centred penalty at the interpolates",
        ("interpolates",),
        INTERPOLATES,
        0.0,
        "target 0",
    ),
    ("approximate-r1", None, 1.0, 0.01): (
        f"approximate R1 ({SIGMA} = 0.01)",
        ("real",),
        REALS,
        0.0,
        "target 0",
    ),
    ("approximate-r1", "real", 1.0, 0.1): (
        f"approximate R1 ({SIGMA} = 0.1)",
        ("real",),
        REALS,
        0.0,
        "target 0",
    ),
    ("approximate-r1", "fake", 1.0, 0.01): (
        f"approximate R2 ({SIGMA} = 0.01)",
        ("fake",),
        FAKES,
        0.0,
        "target 0",
    ),
    ("approximate-r1", "real+fake", 1.0, 0.03): (
        f"approximate R1 + R2 ({SIGMA} = 0.03)",
        ("real", "fake"),
        "the reals and the fakes",
        0.0,
        "target 0",
    ),
}
# loss -> its curves (metrics.jsonl key, legend label), with the penalty "R1" of a run's r1 kind
LOSS_CURVES = {
    "wasserstein": (
        ("critic_loss", "critic loss (Wasserstein + penalty)"),
        ("wasserstein", f"Wasserstein estimate E D(real) {MINUS} E D(fake)"),
        ("penalty", "penalty: R1"),
        ("generator_loss", "generator loss (Wasserstein)"),
    ),
    "non-saturating": (
        ("critic_loss", "critic loss (non-saturating + penalty)"),
        ("penalty", "penalty: R1"),
        ("generator_loss", "generator loss (non-saturating)"),
    ),
    "relativistic": (
        ("critic_loss", "critic loss (relativistic + penalty)"),
        ("penalty", "penalty: R1"),
        ("generator_loss", "generator loss (relativistic)"),
    ),
}


def test_every_kind_placement_and_loss_has_its_expected_labels():
    """The tables above cover every valid (kind, placement) and every loss of the trainer."""
    valid = set()
    for kind in TRAIN_KINDS:
        for at in (None, *PLACEMENTS):
            try:
                TrainConfig(gp_kind=kind, gp_at=at)
            except ConfigError:
                continue
            valid.add((kind, at))
    assert {(kind, at) for kind, at, _, _ in PENALTIES} == valid
    assert set(LOSS_CURVES) == set(LOSSES)


@pytest.mark.parametrize("penalty", PENALTIES, ids=lambda key: f"{key[0]}-at-{key[1]}")
def test_the_penalty_labels_follow_its_kind_and_placement(penalty):
    kind, at, target, sigma = penalty
    config = TrainConfig(gp_kind=kind, gp_at=at, gp_target=target, gp_sigma=sigma)
    name, points, where, reference, reference_label = PENALTIES[penalty]
    labels = figures.figure_labels(config)
    assert labels.penalty == name and labels.points == points
    assert labels.norms_xlabel == f"‖∇D(x)‖ at {where}"
    assert labels.reference == reference and labels.reference_label == reference_label
    assert ("penalty", f"penalty: {name}") in labels.losses


@pytest.mark.parametrize("loss", sorted(LOSS_CURVES))
def test_the_loss_curves_are_named_for_the_loss(loss):
    labels = figures.figure_labels(TrainConfig(loss=loss, gp_kind="r1"))
    assert labels.losses == LOSS_CURVES[loss]


def _texts(fig):
    """Every title, axis label and legend entry of ``fig``."""
    texts = [fig._suptitle.get_text()] if fig._suptitle else []
    for ax in fig.axes:
        texts += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel()]
        legend = ax.get_legend()
        texts += [t.get_text() for t in legend.get_texts()] if legend else []
    return texts


def _captured_figure(monkeypatch, dataset, config, records, tmp_path):
    """(the evaluator's arguments to draw_run, the figure it saved) for ``config``'s run on
    ``dataset`` at its initial parameters."""
    problem = build_problem(dataset, config)
    state = init_state(config, problem.generator, problem.critic)
    captured: dict[str, Any] = {}
    draw = figures.draw_run

    def drawn(*args, **kw):
        captured.update(args=args)
        return draw(*args, **kw)

    monkeypatch.setattr(figures, "draw_run", drawn)
    monkeypatch.setattr(figures, "save", lambda fig, path: captured.update(fig=fig))
    Evaluator(dataset, config, problem, 64).figure(tmp_path / "figure.png", state, records, "t")
    real, fake, norms, _records, labels = captured["args"]
    return (real, fake, norms, labels, problem, state), captured["fig"]


def _records(norms=True):
    norm = [0.4] if norms else None
    return [
        {
            "step": step,
            "critic_loss": 0.7 - 0.01 * step,
            "penalty": 0.05,
            "wasserstein": 0.3,
            "generator_loss": 0.8,
            "norm_mean": norm,
            "norm_min": norm,
            "norm_max": norm,
        }
        for step in (10, 20, 30)
    ]


def _per_sample_norms(critic, params, x):
    """||dD/dx|| of each sample, one sample at a time (the oracle of the evaluator's norms)."""
    grad = jax.vmap(jax.grad(lambda one: critic.apply(params, one[None]).reshape(())))
    return np.linalg.norm(np.asarray(grad(jnp.asarray(x))).reshape(len(x), -1), axis=1)


def test_a_relativistic_r1_r2_image_run_draws_its_own_labels(monkeypatch, tmp_path):
    """A relativistic R1 + R2 run on digits: norms at the reals and the fakes (each the critic's
    per-sample input-gradient norm there), target 0, the relativistic losses, and nowhere a word
    of the Wasserstein loss or of interpolates."""
    config = default_config(
        "digits", loss="relativistic", gp_kind="r1", gp_at="real+fake", backend="xla"
    )
    (real, fake, norms, _, problem, state), fig = _captured_figure(
        monkeypatch, "digits", config, _records(), tmp_path
    )
    try:
        assert set(norms) == {"real", "fake"}
        np.testing.assert_allclose(
            norms["real"], _per_sample_norms(problem.critic, state.d_params, real), rtol=1e-4
        )
        np.testing.assert_allclose(
            norms["fake"], _per_sample_norms(problem.critic, state.d_params, fake), rtol=1e-4
        )
        hist, losses = fig.axes[2], fig.axes[3]
        assert hist.get_xlabel() == "‖∇D(x)‖ at the reals and the fakes"
        assert hist.get_title() == "critic input-gradient norms (R1 + R2)"
        legend = [t.get_text() for t in hist.get_legend().get_texts()]
        assert legend == ["at the reals", "at the fakes", "target 0"]
        (reference,) = hist.get_lines()
        assert list(reference.get_xdata()) == [0.0, 0.0]
        assert [t.get_text() for t in losses.get_legend().get_texts()] == [
            "critic loss (relativistic + penalty)",
            "penalty: R1 + R2",
            "generator loss (relativistic)",
        ]
        first = losses.get_lines()[0]
        assert list(first.get_ydata()) == [r["critic_loss"] for r in _records()]
        text = " ".join(_texts(fig)).lower()
        assert "wasserstein" not in text and "interpolates" not in text
    finally:
        plt.close(fig)


def test_a_2d_approximate_r1_run_marks_zero_and_says_it_logs_no_norms(monkeypatch, tmp_path):
    """On 2-D data the norm curves' panel has the same reference, and says when the run (here
    approximate R1, which takes no input-gradient) logged none."""
    config = default_config(
        "8gaussians", loss="non-saturating", gp_kind="approximate-r1", gp_sigma=0.1
    )
    _, fig = _captured_figure(monkeypatch, "8gaussians", config, _records(norms=False), tmp_path)
    try:
        hist, curves = fig.axes[1], fig.axes[3]
        assert hist.get_xlabel() == "‖∇D(x)‖ at the reals"
        assert list(hist.get_lines()[0].get_xdata()) == [0.0, 0.0]
        assert (
            curves.get_title() == f"no input-gradient norms logged (approximate R1 ({SIGMA} = 0.1))"
        )
        reference = [line for line in curves.get_lines() if line.get_label() == "target 0"]
        assert len(reference) == 1 and list(reference[0].get_ydata()) == [0.0, 0.0]
        assert "generator loss (non-saturating)" in _texts(fig)
    finally:
        plt.close(fig)


def test_a_wgan_gp_run_draws_its_norms_at_the_interpolates_and_its_target(monkeypatch, tmp_path):
    """The Wasserstein loss with WGAN-GP at target 2: norms at the interpolates only, the line at
    2, and the Wasserstein estimate among the curves."""
    config = default_config("8gaussians", gp_target=2.0)
    captured, fig = _captured_figure(monkeypatch, "8gaussians", config, _records(), tmp_path)
    norms = captured[2]
    try:
        assert set(norms) == {"interpolates"} and norms["interpolates"].shape == (64,)
        hist, losses = fig.axes[1], fig.axes[2]
        assert hist.get_xlabel() == "‖∇D(x)‖ at the interpolates"
        assert list(hist.get_lines()[0].get_xdata()) == [2.0, 2.0]
        assert "target 2" in [t.get_text() for t in hist.get_legend().get_texts()]
        legend = [t.get_text() for t in losses.get_legend().get_texts()]
        assert legend[1] == f"Wasserstein estimate E D(real) {MINUS} E D(fake)"
    finally:
        plt.close(fig)
