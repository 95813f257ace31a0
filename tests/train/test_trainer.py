"""The sharded trainer equals the plain one-device trainer; diagnostics, errors and TPU compile.

Multi-device runs happen in subprocesses (the device count is fixed when JAX starts): through the
``python -m fastgp.train.cli check`` command, or ``tests/multidevice_worker.py`` for the other
scenarios.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.sharding import AbstractMesh

from fastgp.train.config import TrainConfig
from fastgp.train.run.check_bounds import EPSILON
from fastgp.train.trainers.core_stats import summarize
from fastgp.train.trainers.state import critic_keys, generator_key, gp_schedule, index_sampler
from fastgp.train.trainers.trainer import Trainer

WORKER = Path(__file__).resolve().parents[1] / "multidevice_worker.py"  # tests/, shared
ROOT = Path(__file__).resolve().parents[2]


def _last_json(stdout: str) -> dict:
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert lines, f"no JSON line in output:\n{stdout}"
    return json.loads(lines[-1])


def _run(args, timeout=300, **env):
    proc = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
        env={**os.environ, "JAX_PLATFORMS": "cpu", **env},
    )
    return proc


def fastgp_check(*argv: str, timeout: float = 300) -> dict:
    """``python -m fastgp.train.cli check ARGV`` run to success: its JSON line."""
    proc = _run(["-m", "fastgp.train.cli", "check", *argv], timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return _last_json(proc.stdout)


def run_worker(scenario: str, devices: int, **env) -> dict:
    proc = _run([str(WORKER), scenario, str(devices)], **env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return _last_json(proc.stdout)


def assert_within_float32_bounds(result: dict) -> None:
    """Every difference of a float32 check within its bound, and the bounds the check's own:
    EPSILON times each quantity's float32 error scale (fastgp.train.run.check_bounds)."""
    bounds = result["tolerance"]
    assert set(bounds.values()) == {EPSILON}
    assert all(result["max_rel_diff"][k] <= bound for k, bound in bounds.items())


# --- equality with the naive path, one subprocess per mesh size --------------------------------

EQUALITY_CASES = [
    # (devices, backend, kind, via): "module" is a plain `python -m fastgp.train.cli check`;
    # "reexec" calls main() in a process whose JAX already started with one device, so it must
    # re-execute.
    (1, "xla", "wgan-gp", "module"),
    (2, "xla", "wgan-lp", "reexec"),
    (3, "xla", "r1", "module"),
    (4, "tpu-interpret", "wgan-gp", "module"),
    (8, "xla", "wgan-gp", "module"),
]


@pytest.mark.parametrize("devices,backend,kind,via", EQUALITY_CASES)
def test_sharded_equals_naive(devices, backend, kind, via):
    argv = [
        "--devices",
        str(devices),
        "--steps",
        "3",
        "--batch-size",
        "24",
        "--n-critic",
        "2",
        "--backend",
        backend,
        "--gp-kind",
        kind,
    ]
    if via == "module":
        proc = _run(["-m", "fastgp.train.cli", "check", *argv])
    else:
        code = (
            "import sys, jax; jax.devices(); from fastgp.train.cli.main import main; "
            f"sys.exit(main({['check', *argv]!r}))"
        )
        proc = _run(["-c", code])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = _last_json(proc.stdout)
    assert result["ok"] is True
    assert result["mesh"] == {
        "axis_names": ["data"],
        "shape": [devices],
        "platform": "cpu",
        "devices": [f"cpu:{i}" for i in range(devices)],
    }
    diffs = result["max_rel_diff"]
    assert set(diffs) == {
        "critic_loss",
        "penalty",
        "wasserstein",
        "generator_loss",
        "norm_stats",
        "critic_grads",
        "generator_grads",
        "run_values",
        "run_updates",
    }
    assert_within_float32_bounds(result)
    assert result["nonfinite_norms"] == 0


LOSS_CASES = [
    # (devices, loss, kind, placement): each loss the trainer speaks, on 2 and 4 devices
    (2, "non-saturating", "r1", "real"),
    (4, "non-saturating", "approximate-r1", "fake"),
    (2, "relativistic", "approximate-r1", "real+fake"),
    (4, "relativistic", "r1", "real+fake"),
    (4, "wasserstein", "wgan-gp", "real"),
]


@pytest.mark.parametrize("devices,loss,kind,placement", LOSS_CASES)
def test_every_loss_and_placement_equals_naive(devices, loss, kind, placement):
    argv = ["--devices", str(devices), "--steps", "2", "--batch-size", "16", "--n-critic", "2"]
    argv += ["--backend", "xla", "--loss", loss, "--gp-kind", kind, "--gp-at", placement]
    result = fastgp_check(*argv)
    assert result["ok"] is True
    assert (result["config"]["loss"], result["config"]["gp_at"]) == (loss, placement)
    assert_within_float32_bounds(result)


def test_lazy_regularisation_equals_naive():
    result = fastgp_check(
        "--devices",
        "3",
        "--steps",
        "3",
        "--batch-size",
        "24",
        "--n-critic",
        "2",
        "--gp-every",
        "3",
        "--backend",
        "xla",
    )
    assert result["ok"] is True


@pytest.mark.parametrize("backend", ["xla", "tpu-interpret"])
def test_nested_reverse_trainer_equals_naive(backend):
    """The sharded trainer with second_order="reverse" against the naive nested-grad trainer."""
    result = fastgp_check(
        "--devices",
        "2",
        "--steps",
        "3",
        "--batch-size",
        "16",
        "--n-critic",
        "2",
        "--backend",
        backend,
        "--second-order",
        "reverse",
    )
    assert result["ok"] is True and result["config"]["second_order"] == "reverse"
    assert_within_float32_bounds(result)


def test_digits_conv_critic_equals_naive():
    """The digits recipe's conv pair (NHWC) through the kernel in TPU-interpret mode, float32."""
    result = fastgp_check(
        "--dataset",
        "digits",
        "--devices",
        "2",
        "--steps",
        "2",
        "--batch-size",
        "32",
        "--n-critic",
        "2",
        timeout=600,
    )
    assert result["ok"] is True and result["dataset"] == "digits"
    assert result["config"]["backend"] == "tpu-interpret" and result["config"]["latent_dim"] == 32
    assert_within_float32_bounds(result)


def test_digits_bf16_multi_block_equals_naive():
    """bfloat16 input-gradients through the kernel on a per-core batch of 192: more than one batch
    block, the last ragged, in either kernel view."""
    from fastgp.kernels.penalty.tiling import lane_blocks, row_blocks

    assert lane_blocks(64, 1, 192).batch < 192 and row_blocks(192, 64, 2).batch < 192
    result = fastgp_check(
        "--dataset",
        "digits",
        "--precision",
        "bf16",
        "--devices",
        "2",
        "--steps",
        "1",
        "--batch-size",
        "384",
        "--n-critic",
        "1",
        timeout=600,
    )
    assert result["ok"] is True and result["config"]["precision"] == "bf16"
    assert result["tolerance"]["critic_grads"] == 5e-2
    assert result["tolerance"]["run_updates"] is None
    assert result["nonfinite_norms"] == 0


@pytest.mark.parametrize("problem,gp_every", [("toy", 3), ("digits", 1)])
def test_fused_and_unfused_runs_agree(problem, gp_every):
    """``Trainer.run`` as one fused scan (TPU, GPU) and as one compiled iteration per call with
    the critic steps written out (CPU): the same steps, states and metrics. With n_critic 3,
    gp_every 3 is decided at trace time when written out and by ``lax.cond`` when fused."""
    from fastgp.train.models.networks import conv_critic, conv_generator, mlp
    from fastgp.train.trainers.trainer import make_mesh

    if problem == "toy":
        models = (
            mlp([2, 16, 2], "gelu"),
            mlp([2, 16, 1], "gelu"),
            lambda key, n: jax.random.normal(key, (n, 2)),
        )
        latent = 2
    else:
        images = np.asarray(jax.random.uniform(jax.random.PRNGKey(3), (40, 8, 8, 1)) * 2 - 1)
        models = (conv_generator(8, 4, "gelu"), conv_critic(4, "gelu"), index_sampler(images))
        latent = 8
    config = TrainConfig(
        batch_size=8,
        n_critic=3,
        gp_every=gp_every,
        backend="xla",
        latent_dim=latent,
        lr_g=1e-3,
        lr_d=1e-3,
    )
    mesh = make_mesh(jax.devices()[:2])
    runs = {}
    for fused in (True, False):
        trainer = Trainer(config, *models, mesh=mesh, fused=fused)
        assert trainer.fused is fused
        state, first = trainer.run(trainer.init(), 2)
        state, second = trainer.run(state, 1)
        runs[fused] = (state, jax.tree.map(lambda a, b: np.concatenate([a, b]), first, second))
    (fused_state, fused_metrics), (state, metrics) = runs[True], runs[False]
    assert int(state.iteration) == int(fused_state.iteration) == 3
    assert jax.tree.structure(metrics) == jax.tree.structure(fused_metrics)  # type: ignore[operator]
    for name in metrics:
        assert metrics[name].shape == fused_metrics[name].shape, name
        assert metrics[name].dtype == fused_metrics[name].dtype, name
    np.testing.assert_array_equal(metrics["gp_applied"], fused_metrics["gp_applied"])
    expected = [[(i * 3 + k) % gp_every == 0 for k in range(3)] for i in range(3)]
    np.testing.assert_array_equal(metrics["gp_applied"], expected)
    for a, b in zip(
        jax.tree.leaves((state, metrics)),
        jax.tree.leaves((fused_state, fused_metrics)),
        strict=True,
    ):
        np.testing.assert_allclose(
            np.asarray(a, np.float64),
            np.asarray(b, np.float64),
            rtol=1e-5,
            atol=1e-6,
            equal_nan=True,
        )


def _conv_inside(model):
    """``model`` with a 1x1 convolution (a no-op on values) hidden in a nested jit and a
    lax.cond of its apply: the networks' program holds a convolution, their code no conv layer."""
    from fastgp.train.models.networks import Model

    def apply(params, x, dtype=jax.numpy.float32):
        @jax.jit
        def identity(h):
            w = jax.numpy.ones((1, 1, 1, 1), h.dtype)
            conv = lambda h: jax.lax.conv_general_dilated(
                h[:, :, None, None], w, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")
            )[:, :, 0, 0]
            return jax.lax.cond(True, conv, lambda h: h, h)

        return model.apply(params, identity(x), dtype)

    return Model(model.init, apply)


def test_default_fusing_follows_the_networks_program():
    """On CPU the iterations of MLP pairs run as one fused scan (cheaper per iteration and to
    compile), those of networks with a convolution anywhere in their program one by one with the
    critic steps written out (XLA:CPU runs convolutions several times slower in a loop body);
    elsewhere always fused; ``fused=`` overrides; and ``run`` goes the way ``fused`` says."""
    from fastgp.train.recipes.defaults import build_problem, default_config
    from fastgp.train.trainers.fusion import default_fused, network_primitives
    from fastgp.train.trainers.trainer import make_mesh

    mesh = make_mesh(jax.devices()[:1])
    for dataset in ("8gaussians", "25gaussians", "digits"):
        config = default_config(dataset, backend="xla")
        problem = build_problem(dataset, config)
        models = problem.generator, problem.critic, problem.sample_real
        assert Trainer(config, *models, mesh=mesh).fused is (dataset != "digits"), dataset
        for platform in ("tpu", "gpu"):
            assert default_fused(platform, problem.generator, problem.critic, config)
        for fused in (True, False):
            assert Trainer(config, *models, mesh=mesh, fused=fused).fused is fused

    generator, critic, sample_real = _toy_models()
    config = TrainConfig(batch_size=8, n_critic=2, latent_dim=2, backend="xla")
    hidden = _conv_inside(critic)
    assert "conv_general_dilated" not in network_primitives(generator, critic, config)
    assert "conv_general_dilated" in network_primitives(generator, hidden, config)
    assert default_fused("cpu", generator, critic, config)
    assert not default_fused("cpu", generator, hidden, config)
    assert not default_fused("cpu", _conv_inside(generator), critic, config)
    assert default_fused("tpu", generator, hidden, config)

    calls = {}
    for fused in (True, False):
        trainer = Trainer(config, generator, critic if fused else hidden, sample_real, mesh=mesh)
        assert trainer.fused is fused
        iteration = trainer.iteration
        calls[fused] = 0

        def counted(state, iteration=iteration, fused=fused):
            calls[fused] += 1
            return iteration(state)

        trainer.iteration = counted  # type: ignore[assignment]
        state, metrics = trainer.run(trainer.init(), 3)
        assert int(state.iteration) == 3 and metrics["generator_loss"].shape == (3, 1)
    assert calls == {True: 0, False: 3}


def test_gp_schedule_is_lazy_and_rescaled():
    config = TrainConfig(gp_every=3, gp_weight=10.0)
    assert [bool(gp_schedule(config, i)[0]) for i in range(7)] == [1, 0, 0, 1, 0, 0, 1]
    assert gp_schedule(config, 0)[1] == 30.0
    assert gp_schedule(TrainConfig(gp_weight=10.0), 5) == (True, 10.0)


def test_every_step_draws_fresh_random_numbers():
    key = jax.random.PRNGKey(0)
    keys = [k for i in range(3) for j in range(4) for k in critic_keys(key, i, j)]
    keys += [generator_key(key, i, 4) for i in range(3)]
    assert len({tuple(np.asarray(k).tolist()) for k in keys}) == len(keys)


def test_index_sampler_draws_rows_of_the_dataset():
    data = np.arange(12, dtype=np.float32).reshape(6, 1, 2)
    batch = np.asarray(index_sampler(data)(jax.random.PRNGKey(1), 5))
    assert batch.shape == (5, 1, 2)
    assert all(any(np.array_equal(row, d) for d in data) for row in batch)


def test_summarize_reads_the_last_step_and_the_replica_spread():
    iterations, n_critic, devices = 2, 3, 4
    shape = (iterations, n_critic, devices)
    metrics = {
        name: np.full(shape, float(i), np.float32)
        for i, name in enumerate(["critic_loss", "penalty", "wasserstein"])
    }
    metrics["norm_mean"] = np.ones(shape, np.float32)
    metrics["norm_min"] = np.arange(devices, dtype=np.float32) * np.ones(shape, np.float32)
    metrics["norm_max"] = metrics["norm_min"] + 1
    metrics["nonfinite"] = np.zeros(shape, np.int32)
    metrics["nonfinite"][-1, -1, 2] = 3
    metrics["gp_applied"] = np.ones(shape[:2], bool)
    metrics["generator_loss"] = np.full((iterations, devices), 5.0, np.float32)
    metrics["generator_loss"][0, 1] = 5.5  # core 1 disagreed once
    out = summarize(metrics)
    assert out == {
        "critic_loss": 0.0,
        "penalty": 1.0,
        "wasserstein": 2.0,
        "generator_loss": 5.0,
        "gp_applied": True,
        "norm_mean": 1.0,
        "norm_min": 0.0,
        "norm_max": 4.0,
        "nonfinite": 3,
        "replica_spread": 0.5,
    }


# --- the check must catch broken reductions ------------------------------------------------------


def test_parameter_updates_are_compared_per_array_in_l2():
    """One Adam-amplified entry does not decide the updates' difference; every core does."""
    from fastgp.train.run.check import max_rel_diff, rel_l2_diff

    ref = {"w": np.full(400, 1e-3), "b": np.zeros(3)}
    ours = {"w": ref["w"].copy(), "b": np.zeros(3)}
    ours["w"][7] += 2e-6  # one entry off by 2e-3 of the largest update
    assert max_rel_diff(ours, ref) == pytest.approx(2e-3)
    assert rel_l2_diff(ours, ref) == pytest.approx(2e-6 / np.sqrt(400 * 1e-6))  # 1e-4
    cores = {"w": np.stack([ref["w"], 1.5 * ref["w"]], -1), "b": np.zeros((3, 2))}
    assert rel_l2_diff(cores, ref) == pytest.approx(0.5)  # core 1 moved 1.5x
    assert rel_l2_diff({"w": ref["w"], "b": np.array([0.0, np.nan, 0.0])}, ref) == np.inf


def test_check_catches_wrong_reductions():
    """Each broken reduction fails the check, the structural ones by thousands of bounds (each
    difference over its bound: ``off``), the gradients scaled by 1.0001 by several."""
    results = run_worker("wrong_reduction", 2)
    off = {
        name: {k: d / result["tolerance"][k] for k, d in result["max_rel_diff"].items()}
        for name, result in results.items()
    }
    assert not any(result["ok"] for result in results.values())
    doubled = off["psum_twice_loss"]  # 2x the global means
    assert min(doubled["wasserstein"], doubled["generator_loss"], doubled["generator_grads"]) > 1e3
    per_core = off["per_core_penalty"]  # each core sees its own mean, and the gradient is summed
    assert min(per_core["penalty"], per_core["critic_grads"]) > 1e3
    scaled = off["scaled_gradients"]  # the gradients show it
    assert min(scaled["critic_grads"], scaled["generator_grads"]) > 3
    assert max(scaled[k] for k in ("wasserstein", "critic_loss", "penalty", "run_values")) < 1
    assert off["wrong_kind"]["penalty"] > 1e3


# --- per-core diagnostics ------------------------------------------------------------------------


def test_per_shard_norm_stats_match_naive_slices():
    devices = 4
    out = run_worker("shard_stats", devices)
    naive = np.asarray(out["naive_norms"])  # (I, C, B)
    shards = naive.reshape(naive.shape[:2] + (devices, -1))  # core n holds rows n*b:(n+1)*b
    sharded = {k: np.asarray(v) for k, v in out["sharded"].items()}
    assert sharded["norm_min"].shape == shards.shape[:3]
    np.testing.assert_allclose(sharded["norm_min"], shards.min(-1), rtol=1e-5)
    np.testing.assert_allclose(sharded["norm_max"], shards.max(-1), rtol=1e-5)
    np.testing.assert_allclose(sharded["norm_mean"], shards.mean(-1), rtol=1e-5)
    assert np.ptp(sharded["norm_min"], axis=-1).min() > 0  # really per core, not global
    np.testing.assert_array_equal(sharded["nonfinite"], 0)
    # One NaN real sample at global index 13 (core 13 // 6 = 2) shows up on that core only.
    np.testing.assert_array_equal(out["poisoned_nonfinite"], [[[0, 0, 1, 0]]])


# --- precision ------------------------------------------------------------------------------------


def test_bf16_is_finite_and_close():
    out = run_worker("bf16", 2)
    assert out["finite"]
    assert max(out["vs_f32"].values()) < 5e-2
    assert max(out["vs_naive_bf16"].values()) < 5e-2
    assert out["params_vs_naive_bf16"] < 5e-2


# --- clear errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("precision", "fp16", "precision"),
        ("backend", "cuda", "backend"),
        ("gp_kind", "wgan", "gp_kind"),
        ("batch_size", 0, "batch_size"),
        ("n_critic", 0, "n_critic"),
        ("gp_every", 1.5, "gp_every"),
        ("gp_target", 0.0, "gp_target"),
        ("lr_d", float("nan"), "lr_d"),
        ("betas", (0.5, 1.0), "betas"),
        ("decay_fraction", 1.5, "decay_fraction"),
        ("total_steps", 0, "total_steps"),
    ],
)
def test_config_rejects_bad_flags(field, value, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**{field: value})


def test_decay_needs_total_steps():
    with pytest.raises(ValueError, match="decay_fraction > 0 needs total_steps"):
        TrainConfig(decay_fraction=0.5)


def test_learning_rates_decay_linearly_to_zero_over_the_last_fraction():
    from fastgp.train.trainers.state import lr_schedule

    schedule = lr_schedule(2e-3, 100, 0.5)
    assert [float(schedule(i)) for i in (0, 49, 50)] == pytest.approx([2e-3, 2e-3, 2e-3])
    assert float(schedule(75)) == pytest.approx(1e-3)
    assert float(schedule(100)) == 0.0 and float(schedule(150)) == 0.0
    assert lr_schedule(1e-3, None, 0.0) == 1e-3


def _toy_models():
    from fastgp.train.models.networks import mlp

    return mlp([2, 4, 2]), mlp([2, 4, 1]), lambda key, n: jax.random.normal(key, (n, 2))


def test_indivisible_global_batch_names_both_numbers():
    mesh = AbstractMesh((4,), ("data",))
    with pytest.raises(ValueError, match=r"batch_size 10 is not divisible by the 4 devices"):
        Trainer(TrainConfig(batch_size=10), *_toy_models(), mesh=mesh)


def test_mesh_must_have_one_data_axis():
    with pytest.raises(ValueError, match="one axis named 'data'"):
        Trainer(TrainConfig(batch_size=8), *_toy_models(), mesh=AbstractMesh((2,), ("batch",)))


# --- ahead-of-time compile for a 4-chip TPU v5e mesh --------------------------------------------


@pytest.mark.aot
@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="needs libtpu (jax[tpu])")
def test_sharded_step_compiles_for_tpu_v5e_mesh():
    """The toy MLP's (B, 2) input-gradients: "auto" leaves dense leaves to XLA on TPU (see
    fastgp._penalty.binding), "pallas" forces the kernel into both compiled programs."""
    out = run_worker("aot", 1, ALLOW_MULTIPLE_LIBTPU_LOAD="1")
    assert out == {
        "platform": "tpu",
        "devices": 4,
        "auto": {"critic_step": False, "run": False},
        "pallas": {"critic_step": True, "run": True},
    }


@pytest.mark.aot
@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="needs libtpu (jax[tpu])")
def test_bf16_input_gradients_reach_the_tpu_kernel():
    """Lowered for TPU, the penalty's Mosaic kernel reads the conv critic's input-gradients in the
    compute dtype (bf16 under bf16) and returns float32 statistics with backend "pallas"; the
    default, "auto", is XLA on TPU (see fastgp._penalty.binding) and has no kernel."""
    out = run_worker("aot_precision", 1, ALLOW_MULTIPLE_LIBTPU_LOAD="1")
    for precision in ("f32", "bf16"):
        for program in ("critic_step", "run"):
            assert out[f"pallas {precision}"][program] == [[[precision], ["f32"]]], (
                precision,
                program,
            )
            assert out[f"auto {precision}"][program] == [], (precision, program)
