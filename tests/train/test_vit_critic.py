"""The ViT critic (``--critic vit``): per-sample, its penalty exact through ``fastgp.attention``,
the sharded trainer equal to the naive one with it (``fastgp check --critic vit``), its recipe,
its flag, and a checkpointed run that resumes exactly."""

import functools
import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import test_cli
from test_data_models import _block_maxima

import fastgp
from fastgp.testing import assert_penalty_matches_naive
from fastgp.train.cli.main import main
from fastgp.train.config import TrainConfig
from fastgp.train.data.sets import load_digits
from fastgp.train.models.networks import vit_critic
from fastgp.train.recipes.defaults import (
    DIGITS,
    DIGITS_VIT,
    VIT,
    build_problem,
    default_config,
    default_steps,
    recipe,
)
from fastgp.train.run.check_bounds import EPSILON

ROOT = Path(__file__).resolve().parents[2]
# The trainer tests' toy images: uniform pixels in [-1, 1] (tests/train/test_trainer.py).
TOY_IMAGES = np.asarray(jax.random.uniform(jax.random.PRNGKey(3), (6, 8, 8, 1)) * 2 - 1)


def small_vit(**kwargs):
    """A tiny ViT of the recipe's shape family: 2x2 patches, 2 blocks, 2 heads of 8."""
    return vit_critic(**{"width": 16, "depth": 2, "heads": 2, "patch": 2, **kwargs})


# --- the network ---------------------------------------------------------------------------------


@pytest.mark.parametrize("images", ["digits", "toy"])
def test_vit_critic_is_per_sample_and_matches_plain_attention(images):
    """No sample's score depends on another sample (the penalty's requirement), and with
    ``fastgp.attention`` the scores are those of plain-jnp attention."""
    x = jnp.asarray(load_digits()[:4] if images == "digits" else TOY_IMAGES[:4])
    critic, plain = small_vit(), small_vit(attention=fastgp.naive_attention)

    @jax.jit
    def check(key, x):
        p = critic.init(key)
        blocks = _block_maxima(lambda v: critic.apply(p, v), x, jax.jacrev)
        return critic.apply(p, x), plain.apply(p, x), blocks

    scores, plain_scores, (diag, off) = check(jax.random.key(0), x)
    assert scores.shape == (4,) and scores.dtype == jnp.float32
    assert float(diag) > 0 and float(off) == 0
    np.testing.assert_allclose(scores, plain_scores, rtol=1e-5, atol=1e-6)


def test_vit_critic_shapes_bf16_and_refusals():
    """Any (H, W, C) the patch divides; bfloat16 close to float32, float32 out; float32 params;
    patches that do not tile the image, or heads that do not divide the width, are refused."""
    critic = vit_critic(width=16, depth=1, heads=4, patch=4, image=(8, 12, 3))
    x = jax.random.uniform(jax.random.key(1), (5, 8, 12, 3), minval=-1, maxval=1)

    @jax.jit
    def outputs(key, x):
        p = critic.init(key)
        return critic.apply(p, x), critic.apply(p, x, dtype=jnp.bfloat16)

    f32, bf16 = outputs(jax.random.key(0), x)
    assert f32.shape == bf16.shape == (5,) and bf16.dtype == jnp.float32
    assert float(jnp.linalg.norm(bf16 - f32) / jnp.linalg.norm(f32)) < 0.05
    params = jax.eval_shape(critic.init, jax.random.key(0))
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(params))
    assert params["pos"].shape == (6, 16)  # (8 / 4) x (12 / 4) tokens
    with pytest.raises(ValueError, match="patch 3 must divide"):
        vit_critic(patch=3)
    with pytest.raises(ValueError, match="heads 3 the width 64"):
        vit_critic(width=64, heads=3)


# --- the penalty through it ----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("kind,patch", [("wgan-gp", 2), ("r1", 4)])
def test_penalty_through_the_vit_matches_the_naive_penalty(kind, patch):
    """fastgp.gradient_penalty through the ViT (attention by fastgp.attention; 16 tokens of 2x2
    or the recipe's 4 of 4x4) against the naive nested-grad penalty: value, parameter gradient
    and a Hessian-vector product."""
    critic = small_vit(patch=patch)
    params = critic.init(jax.random.key(0))
    x = jnp.asarray(np.concatenate([load_digits()[:3], TOY_IMAGES[:3]]))
    errors = assert_penalty_matches_naive(critic.apply, params, x, kind=kind, orders=2)
    assert errors.hvp is not None and errors.hvp <= 1e-5


@pytest.mark.slow
def test_naive_penalty_through_fastgp_attention_equals_plain_attention():
    """The naive penalty's value, parameter gradient and HVP (third derivatives of the critic)
    are the same whether the ViT attends with ``fastgp.attention`` or with plain jnp."""
    critic, plain = small_vit(), small_vit(attention=fastgp.naive_attention)
    params = critic.init(jax.random.key(2))
    tangent = jax.tree.map(lambda a: jnp.ones_like(a) * 0.1, params)
    x = jnp.asarray(load_digits()[:4])

    def derivatives(model):
        def loss(p):
            return fastgp.naive_gradient_penalty(functools.partial(model.apply, p), x)

        grad = jax.grad(loss)
        return loss(params), grad(params), jax.jvp(grad, (params,), (tangent,))[1]

    ours, ref = jax.jit(lambda: derivatives(critic))(), jax.jit(lambda: derivatives(plain))()
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(ref), strict=True):
        scale = float(np.max(np.abs(b))) or 1.0
        np.testing.assert_allclose(np.asarray(a) / scale, np.asarray(b) / scale, atol=1e-5)


# --- the recipe and the flag ---------------------------------------------------------------------


def test_vit_recipe_and_problem():
    """--critic vit on digits: the ViT recipe's config and networks (the digits recipe's conv
    generator); the default stays the conv recipe; 2-D data and unknown names are refused."""
    config = default_config("digits", critic="vit", backend="xla")
    assert config.critic == "vit" and config.total_steps == default_steps("digits", "vit")
    assert recipe("digits", "vit") is DIGITS_VIT and default_steps("digits", "vit") == 3000
    assert (config.lr_d, config.lr_g) == (DIGITS_VIT.fields["lr_d"], DIGITS_VIT.fields["lr_g"])
    assert default_config("digits") == default_config("digits", critic="conv")
    assert default_config("digits").critic == "conv" and recipe("digits") is DIGITS
    problem = build_problem("digits", config)
    params = jax.eval_shape(problem.critic.init, jax.random.key(0))
    assert len(params["blocks"]) == VIT.depth and params["embed"]["w"].shape[1] == VIT.width
    g_params = jax.eval_shape(problem.generator.init, jax.random.key(0))
    conv_problem = build_problem("digits", default_config("digits"))
    conv_g = jax.eval_shape(conv_problem.generator.init, jax.random.key(0))
    assert jax.tree.map(lambda a: a.shape, g_params) == jax.tree.map(lambda a: a.shape, conv_g)
    with pytest.raises(ValueError, match="the vit critic takes images and 8gaussians is 2-D"):
        default_config("8gaussians", critic="vit")
    with pytest.raises(ValueError, match="takes images"):
        build_problem("swissroll", TrainConfig(critic="vit"))
    with pytest.raises(ValueError, match="critic"):
        TrainConfig(critic="transformer")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--critic", "vit"],  # the default dataset, 8gaussians
        ["train", "--critic", "vit", "--dataset", "25gaussians"],
        ["check", "--critic", "vit"],  # the check's default dataset, 8gaussians
    ],
)
def test_vit_on_2d_data_names_the_critic_flag(argv, capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--out", str(tmp_path / "run")] if argv[0] == "train" else argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "argument --critic: the vit critic takes images" in err and "--dataset digits" in err


def test_resuming_with_another_critic_is_refused_and_old_checkpoints_are_conv():
    """A checkpoint records the critic in its config; --critic that contradicts it is an error
    naming the flag; a checkpoint from before the flag (no "critic") resumes as conv."""
    from fastgp.train.run.options import RunError, RunOptions
    from fastgp.train.run.resolve import Resumed, _continued

    config = json.loads(json.dumps(default_config("digits", critic="vit").__dict__))
    resumed = Resumed(3, {"dataset": "digits", "config": config}, None)
    options = RunOptions(dataset=None, out="run", resume=True)
    assert _continued(options, {}, resumed)[1].critic == "vit"
    with pytest.raises(RunError, match=r"--critic conv contradicts the checkpoint .*critic=vit"):
        _continued(options, {"critic": "conv"}, resumed)
    old = {k: v for k, v in default_config("digits").__dict__.items() if k != "critic"}
    resumed = Resumed(3, {"dataset": "digits", "config": json.loads(json.dumps(old))}, None)
    assert _continued(options, {}, resumed)[1] == default_config("digits")
    assert _continued(options, {"critic": "conv"}, resumed)[1].critic == "conv"
    with pytest.raises(RunError, match=r"--critic vit contradicts the checkpoint .*critic=conv"):
        _continued(options, {"critic": "vit"}, resumed)


# --- end to end: the check and a checkpointed run ------------------------------------------------


def _cli(env, *args):
    """``fastgp ARGS`` run to success: its last JSON line."""
    return test_cli.last_json(test_cli.fastgp(env, *args, timeout=600).stdout)


@pytest.mark.slow
def test_check_with_the_vit_critic_equals_naive(child_env):
    """``fastgp check --dataset digits --critic vit``: the sharded trainer on 2 devices (the
    penalty kernel in TPU-interpret mode) against the naive trainer, float32 bounds."""
    flags = ["--devices", "2", "--steps", "2", "--batch-size", "16", "--n-critic", "2"]
    result = _cli(child_env, "check", "--dataset", "digits", "--critic", "vit", *flags)
    assert result["ok"] is True and result["dataset"] == "digits"
    assert result["config"]["critic"] == "vit" and result["config"]["backend"] == "tpu-interpret"
    assert result["mesh"]["shape"] == [2] and result["nonfinite_norms"] == 0
    bounds = result["tolerance"]
    assert set(bounds.values()) == {EPSILON}  # times each quantity's float32 error scale
    assert all(result["max_rel_diff"][k] <= bound for k, bound in bounds.items())


def _final_state(out, step=4):
    """(config, TrainState checkpointed at ``step``) of the run in ``out``."""
    from fastgp.train.run.checkpoints import Checkpoints
    from fastgp.train.trainers.state import init_state

    run = json.loads((out / "run.json").read_text())
    config = TrainConfig(**{**run["config"], "betas": tuple(run["config"]["betas"])})
    problem = build_problem("digits", config)
    template = init_state(config, problem.generator, problem.critic)
    return config, Checkpoints(out / "checkpoints").state(step, template)


@pytest.mark.slow
def test_vit_run_checkpoints_and_resumes_exactly(tmp_path, child_env):
    """A digits run with the ViT critic, resumed from its step-2 checkpoint (a copy of the run
    without its step-4 one, as a run killed between the two leaves it), ends at the parameters of
    the uninterrupted 4-step run; the checkpoints record the critic, so --resume needs no
    --critic. (tests/train/test_cli.py resumes a --stop-at run of the conv critic.)"""
    flags = ["--dataset", "digits", "--critic", "vit", "--steps", "4", "--batch-size", "16"]
    flags += ["--log-every", "2", "--checkpoint-every", "2", "--eval-every", "4", "--no-progress"]
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    _cli(child_env, "train", *flags, "--out", str(whole))
    shutil.copytree(whole, parts)
    shutil.rmtree(parts / "checkpoints" / "4")
    resumed = _cli(child_env, "train", "--resume", "--out", str(parts), "--no-progress")
    assert resumed["steps"] == 4 and resumed["dataset"] == "digits"
    records = (parts / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(record)["step"] for record in records] == [2, 4]
    config, state = _final_state(parts)
    assert config.critic == "vit" and len(state.d_params["blocks"]) == VIT.depth
    for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(_final_state(whole)[1]), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_train_help_lists_the_critic_flag(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = capsys.readouterr().out
    assert "--critic {conv,vit}" in text and "(default: conv)" in text
    # the usage line, the option, and the helps that name the critic they shape: --vit-patch's and
    # --recipe's (R3GAN's recipe is the ViT's on mnist)
    assert text.count("--critic") == 4
    assert "patch side of --critic vit" in text and "r3gan: --dataset mnist --critic vit" in text
