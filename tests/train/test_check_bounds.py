"""``fastgp check``'s bounds (``fastgp.train.run.check_bounds``): each quantity's float32 error
scale, and the verdict they give on a grid of meshes: ok for the correct trainer, not ok when every
gradient the sharded trainer all-reduces comes out 1.0001 times too large.

The grid runs in subprocesses (``tests/check_grid_worker.py``; the device count is fixed when JAX
starts), one per mesh size and two for each job of two processes; the two cells run here use this
process's 8 devices (``tests/conftest.py``).
"""

import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fastgp.train.cli.launcher import free_port
from fastgp.train.config import TrainConfig
from fastgp.train.run import check
from fastgp.train.run.check_bounds import EPSILON, UNIT_ROUNDOFF, AdamDrift, scaled_difference
from fastgp.train.run.check_scales import StepScales, _term, longest_contraction
from fastgp.train.trainers import trainer
from fastgp.train.trainers.naive_trainer import NaiveTrainer
from fastgp.train.trainers.state import critic_keys

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "check_grid_worker.py"
LOSS_KINDS = [("wasserstein", "wgan-gp"), ("non-saturating", "r1"), ("relativistic", "wgan-lp")]
LOSS_KINDS += [("wasserstein", "approximate-r1")]
# devices -> samples a device: every mesh twice, and each of 1 to 4 samples a device on two or
# three meshes (a covering of the 5 x 4 grid in half its cells; the in-process cells below add
# 8 x 3 and 3 x 1)
GRID = {1: (1, 4), 2: (2, 3), 3: (1, 4), 4: (2, 3), 8: (2, 4)}
MESHES = tuple(GRID)
BATCHES = sorted(
    {devices * per_device for devices, counts in GRID.items() for per_device in counts}
)


# --- the error scales --------------------------------------------------------------------------


def test_scaled_difference_compares_arrays_entries_and_every_core():
    ref = {"w": np.array([1.0, -1.0, 1e-3]), "b": np.zeros(2)}
    scale = {"w": np.array([2.0, 2.0, 1e-3]), "b": np.ones(2)}
    ours = {"w": ref["w"] + [0.0, 0.0, 1e-4], "b": np.zeros(2)}
    assert scaled_difference(ours, ref, scale) == pytest.approx(1e-4 / 2.0)  # per array
    assert scaled_difference(ours, ref, scale, per_entry=True) == pytest.approx(0.1)
    cores = {"w": np.stack([ref["w"], ref["w"] + 1.0], -1), "b": np.zeros((2, 2))}
    assert scaled_difference(cores, ref, scale) == pytest.approx(0.5)  # core 1 is off by 1
    nan = {"w": np.array([np.nan, 0.0, 0.0]), "b": np.zeros(2)}
    assert scaled_difference(nan, {**nan, "w": nan["w"].copy()}, scale) == 0.0
    assert scaled_difference(nan, ref, scale) == np.inf
    assert scaled_difference({"x": 1.0}, {"x": 1.0}, {"x": 0.0}) == 0.0
    assert scaled_difference({"x": 1.0}, {"x": 0.5}, {"x": 0.0}) == np.inf


def test_terms_count_their_operands_magnitudes():
    """|t| + |dt/ds| |s|: a difference counts both sides; the penalty's gradient at WGAN-GP's
    target, where phi'(n) = 0, still carries the rounding of n."""
    r, f = jnp.array([1.0, 3.0]), jnp.array([1.0, -2.0])
    t, _, size, weights = _term(lambda r, f: f - r, r, f)
    np.testing.assert_allclose(t, [0.0, -5.0])
    np.testing.assert_allclose(size, [2.0, 10.0])  # |f - r| + |r| + |f|
    np.testing.assert_allclose(weights, [[1.0, 1.0], [1.0, 1.0]])
    n = jnp.array([1.0, 3.0])
    phi, (dphi,), size, (weight,) = _term(lambda n: (n - 1.0) ** 2, n)
    np.testing.assert_allclose(dphi, [0.0, 4.0])
    np.testing.assert_allclose(phi, [0.0, 4.0])
    np.testing.assert_allclose(size, [0.0, 4.0 + 4.0 * 3.0])  # |phi| + |phi'| n
    np.testing.assert_allclose(weight, [2.0, 4.0 + 2.0 * 3.0])  # |phi'| + |phi''| n


def _toy_naive(**fields) -> NaiveTrainer:
    config = TrainConfig(backend="xla", latent_dim=2, lr_g=1e-3, lr_d=1e-3, **fields)
    return NaiveTrainer(config, *check.toy_problem(config))


def test_the_score_gap_is_scaled_by_the_scores_not_by_itself():
    """The Wasserstein estimate's R is mean |D(real)| + mean |D(fake)|, and the critic's
    gradient's the per-sample |dD(real)/dtheta| + |dD(fake)/dtheta|: what the two means sum,
    however much they cancel (critic step 1 with gp_every 2 takes no penalty)."""
    naive = _toy_naive(batch_size=4, n_critic=2, gp_every=2)
    scales, state = StepScales(naive), naive.init()
    out = scales.critic(state, 1)
    real_key, noise_key, _ = critic_keys(state.key, state.iteration, 1)
    real = naive.sample_real(real_key, 4)
    fake = naive._fake(state.g_params, noise_key)
    score = lambda p, x: naive.critic.apply(p, x)
    r, f = score(state.d_params, real), score(state.d_params, fake)
    np.testing.assert_allclose(
        out["wasserstein"].reduction, np.mean(np.abs(r) + np.abs(f)), rtol=1e-6
    )
    assert out["penalty"].reduction == out["penalty"].evaluation == 0.0
    j_r, j_f = (jax.jacrev(score)(state.d_params, x) for x in (real, fake))
    expected = jax.tree.map(lambda a, b: np.mean(np.abs(a) + np.abs(b), 0), j_r, j_f)
    for got, want in zip(
        jax.tree.leaves(out["critic_grads"].reduction), jax.tree.leaves(expected), strict=True
    ):
        np.testing.assert_allclose(got, want, rtol=1e-5)
    assert out["wasserstein"].evaluation > 0  # the probe moves the scores
    assert scales.k == longest_contraction(state.g_params, state.d_params) == 32
    assert scales.sample_size == 2


def test_adam_drift_bounds_each_entry_by_its_gradients_precision():
    """A gradient entry within its bound of zero: Adam's first step is its sign, which the
    rounding decides, so the entry may move by 2 lr. One far above it: first order, tiny. Each
    parameter's own rounding: 2u |theta|."""
    config = TrainConfig(lr_d=1e-3, betas=(0.5, 0.9))
    params = {"w": np.array([1.0, 1.0, 4.0])}
    opt_state = optax.adam(1e-3, 0.5, 0.9).init(params)
    grads = {"w": np.array([0.0, 1.0, 1.0])}
    drift = AdamDrift(config, "critic")
    theta = drift.step(opt_state, grads, {"w": 1e-6}, params)["w"]
    assert theta[0] == pytest.approx(2e-3 + 2 * UNIT_ROUNDOFF)
    assert 0 < theta[1] - 2 * UNIT_ROUNDOFF < 1e-8
    assert theta[2] - theta[1] == pytest.approx(2 * UNIT_ROUNDOFF * 3)
    _, opt_state = optax.adam(1e-3, 0.5, 0.9).update(grads, opt_state, params)
    again = drift.step(opt_state, grads, {"w": 1e-6}, params)["w"]
    assert np.all(again > theta)  # it only grows within an iteration


# --- the verdict over meshes -------------------------------------------------------------------


def _planted(monkeypatch) -> None:
    """Every all-reduced gradient of the sharded trainer 1.0001 times too large (as
    tests/check_grid_worker.py and tests/multidevice_worker.py plant it)."""
    honest = trainer._packed_value_and_grad

    def scaled(*args, **kwargs):
        value, grads = honest(*args, **kwargs)
        return value, jax.tree.map(lambda g: 1.0001 * g, grads)

    monkeypatch.setattr(trainer, "_packed_value_and_grad", scaled)


@pytest.mark.parametrize(
    "devices,per_device,loss,kind",
    [
        (8, 3, "wasserstein", "wgan-gp"),  # once "not ok": the gap's difference, 6e-5 of itself
        (3, 1, "non-saturating", "r1"),  # one sample per core: its own rounding, not the GEMM's
    ],
)
def test_the_check_is_ok_and_catches_a_planted_error(devices, per_device, loss, kind, monkeypatch):
    cell = {"n_critic": 2, "backend": "xla", "loss": loss, "gp_kind": kind}
    result = check.run_check(devices, 1, devices * per_device, **cell)
    assert result["ok"] is True, result["max_rel_diff"]
    assert set(result["tolerance"].values()) == {EPSILON}
    _planted(monkeypatch)
    planted = check.run_check(devices, 1, devices * per_device, **cell)
    assert planted["ok"] is False
    assert planted["max_rel_diff"]["critic_grads"] > EPSILON
    assert planted["max_rel_diff"]["generator_grads"] > EPSILON


def _cell(batch: int, **fields) -> dict:
    """One toy cell of the grid: the losses and penalties in turn over the grid's global batches,
    so that meshes of the same batch share the naive programs (one compilation cache a run)."""
    loss, kind = LOSS_KINDS[BATCHES.index(batch) % len(LOSS_KINDS)]
    cell = {"batch_size": batch, "steps": 1, "n_critic": 2, "backend": "xla"}
    return {**cell, "loss": loss, "gp_kind": kind, **fields}


# Digits' conv pair, one sample per device (each core's convolutions on one sample).
DIGITS = {8: [{"batch_size": 8, "dataset": "digits"}]}


def _records(proc: subprocess.CompletedProcess) -> list[dict]:
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def _assert_verdicts(records: list[dict], cells: list[dict]) -> None:
    """Every cell ok for the correct trainer, not ok for the planted error; the margins printed
    (``pytest -s``): the largest difference of the correct trainer, and the planted gradients',
    in units of the bound."""
    assert len(records) == len(cells)
    for record in records:
        assert record["ok"] is True, record
        assert record["planted_ok"] is False, record
        assert max(record["correct"].values()) <= EPSILON
        planted = {k: record["planted"][k] / EPSILON for k in ("critic_grads", "generator_grads")}
        print(
            json.dumps(
                {
                    "cell": record["cell"],
                    "correct": max(record["correct"].values()) / EPSILON,
                    "planted": planted,
                    "seconds": record["seconds"],
                }
            )
        )


@pytest.mark.slow
@pytest.mark.parametrize("devices", MESHES)
def test_every_mesh_is_ok_and_catches_a_planted_error(devices, child_env):
    cells = [_cell(devices * per_device) for per_device in GRID[devices]]
    cells += [{"steps": 1, "n_critic": 1, "backend": "xla", **c} for c in DIGITS.get(devices, [])]
    proc = subprocess.run(
        [sys.executable, str(WORKER), str(devices), json.dumps(cells)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=child_env,
        timeout=900,
    )
    _assert_verdicts(_records(proc), cells)


@pytest.mark.slow
@pytest.mark.parametrize("devices,per_device", [(1, 3), (4, 1)])
def test_two_processes_are_ok_and_catch_a_planted_error(devices, per_device, child_env):
    """2 processes of ``devices`` devices each (gloo collectives, as ``fastgp check
    --processes 2``), the XLA backend."""
    cells = [_cell(2 * devices * per_device)]
    coordinator = f"127.0.0.1:{free_port()}"
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                str(devices),
                json.dumps(cells),
                coordinator,
                "2",
                str(i),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=child_env,
        )
        for i in range(2)
    ]
    outputs = [p.communicate(timeout=900) for p in procs]
    first = subprocess.CompletedProcess([], procs[0].returncode, *outputs[0])
    assert procs[1].returncode == 0, outputs[1][1][-4000:]
    records = _records(first)
    _assert_verdicts(records, cells)
    assert records[0]["cell"]["processes"] == 2 and records[0]["cell"]["devices"] == 2 * devices
