"""The benchmark critic zoo (benchmarks/zoo/critics.py): fastgp's penalty equals the naive one on
every architecture, with every second-order and remat option, and every critic is per-sample.

The penalty checks run each architecture at a reduced size: the same constructor with fewer
channels, smaller images and, for the ViT, LayerNorm-conv and StyleGAN2 critics, fewer blocks
(the blocks repeat the same code, so one exercises every kind of layer). A value, parameter
gradient and Hessian-vector product of the four options against the naive penalty compile 8 large
programs per critic, so the module compiles with most XLA optimisations off and with a
compilation cache: the naive reference, the same program for all four options, compiles once per
critic. The shape and dtype checks trace the zoo's own configurations (CPU and TPU).
"""

import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.compilation_cache import compilation_cache

from benchmarks import workloads as W
from benchmarks.zoo import critics as zoo
from fastgp._penalty.reference import naive_gradient_penalty
from fastgp.testing import assert_penalty_matches_naive
from fastgp.train.models.networks import mlp

# name: (model, per-sample shape): the zoo's architectures, reduced.
SMALL = {
    "resnet32": (zoo.resnet32(8), (8, 8, 3)),
    "dcgan32": (W.dcgan_critic(8, 32, layout="NHWC"), (32, 32, 3)),
    "lnconv32": (zoo.lnconv32(8, image=8, blocks=1), (8, 8, 1)),
    "stylegan2-64": (zoo.stylegan2_64((4, 8), image=8), (8, 8, 3)),
    "vit32": (zoo.vit32(16, depth=1, heads=2, image=8), (8, 8, 3)),
    "mlp": (mlp([48, 16, 16, 16, 1]), (48,)),
}
OPTIONS: dict[str, dict[str, Any]] = {
    "default": {},
    "reverse": dict(second_order="reverse"),
    "remat-nothing": dict(remat="nothing"),
    "remat-dots": dict(remat="dots"),
}
FAST_COMPILES = {
    "jax_disable_most_optimizations": True,
    "jax_persistent_cache_min_compile_time_secs": 0.0,
    "jax_persistent_cache_min_entry_size_bytes": 0,
}


def _read(name):
    """A config value, whether or not the option has a context manager."""
    try:
        return getattr(jax.config, name)
    except AttributeError:
        return jax.config.read(name)


@pytest.fixture(scope="module")
def fast_compiles(tmp_path_factory):
    """Most XLA optimisations off and a compilation cache in a temporary directory, for this
    module only (the previous settings and an uninitialised cache are restored after). The
    directory is shared by pytest-xdist's workers, so each naive program compiles once."""
    saved = {name: _read(name) for name in FAST_COMPILES}
    saved_dir = _read("jax_compilation_cache_dir")
    for name, value in FAST_COMPILES.items():
        jax.config.update(name, value)
    base = tmp_path_factory.getbasetemp()  # under xdist, a worker's folder in this run's
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "zoo_jit_cache"
    shared.mkdir(exist_ok=True)
    compilation_cache.set_cache_dir(str(shared))
    compilation_cache.reset_cache()
    yield
    for name, value in saved.items():
        jax.config.update(name, value)
    jax.config.update("jax_compilation_cache_dir", saved_dir)
    compilation_cache.reset_cache()


def test_the_small_models_cover_the_zoo():
    assert SMALL.keys() == zoo.ZOO_CPU.keys() == zoo.ZOO_TPU.keys()


@pytest.mark.parametrize("option", list(OPTIONS))
@pytest.mark.parametrize("critic", list(SMALL))
def test_penalty_matches_naive(fast_compiles, critic, option):
    """Value, parameter gradient and Hessian-vector product, rtol 1e-5, with the zoo's kind."""
    model, shape = SMALL[critic]
    kind = zoo.ZOO_CPU[critic].kind
    params, _, real, _, _ = W.inputs(W.CriticSpec(critic, model, 2, shape, jnp.float32, kind))
    assert_penalty_matches_naive(model.apply, params, real, kind=kind, **OPTIONS[option])


@pytest.mark.parametrize("critic", list(SMALL))
def test_critic_is_per_sample(fast_compiles, critic):
    """Changing sample 1 changes score 1 and no other."""
    model, shape = SMALL[critic]
    params, _, real, fake, _ = W.inputs(W.CriticSpec(critic, model, 3, shape))
    apply = jax.jit(model.apply)
    before = apply(params, real)
    after = apply(params, real.at[1].set(fake[1]))
    np.testing.assert_array_equal(np.asarray(after)[[0, 2]], np.asarray(before)[[0, 2]])
    assert not np.isclose(float(after[1]), float(before[1]))


@pytest.mark.parametrize("zoo_name", ["ZOO_CPU", "ZOO_TPU"])
@pytest.mark.parametrize("critic", list(zoo.ZOO_CPU))
def test_zoo_specs_score_each_sample_in_float32(zoo_name, critic):
    """The zoo's own configurations (traced, not compiled): float32 parameters, inputs in the
    spec's dtype (float32 on CPU, bfloat16 for TPU), (B,) float32 scores."""
    spec = getattr(zoo, zoo_name)[critic]
    assert spec.name == critic and spec.kind == ("r1" if critic == "stylegan2-64" else "wgan-gp")
    assert spec.dtype == (jnp.float32 if zoo_name == "ZOO_CPU" else jnp.bfloat16)
    params, _, real, _, _ = jax.eval_shape(lambda: W.inputs(spec))
    assert real.shape == (spec.batch, *spec.shape) and real.dtype == spec.dtype
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(params))
    scores = jax.eval_shape(lambda p, x: spec.model.apply(p, x, spec.dtype), params, real)
    assert scores.shape == (spec.batch,) and scores.dtype == jnp.float32


def test_r1_critic_loss_penalises_the_reals(fast_compiles):
    """For kind="r1" the critic loss adds the penalty at the reals, not at interpolates."""
    model, shape = SMALL["mlp"]
    spec = W.CriticSpec("mlp-r1", model, 4, shape, jnp.float32, "r1")
    params, _, real, fake, key = W.inputs(spec)
    variants = ("naive", "fastgp", "fastgp-reverse")

    @jax.jit
    def losses(params, real, fake, key):
        plain = W.critic_loss(spec, "plain", params, real, fake, key)
        at_reals = naive_gradient_penalty(
            lambda x: model.apply(params, x), real, kind="r1", weight=W.GP_WEIGHT
        )
        return plain + at_reals, [W.critic_loss(spec, v, params, real, fake, key) for v in variants]

    expected, got = losses(params, real, fake, key)
    for variant, loss in zip(variants, got, strict=True):
        np.testing.assert_allclose(float(loss), float(expected), rtol=1e-6, err_msg=variant)


def test_program_counts_classify_convolutions():
    """zoo_programs.hlo_counts on a stride-2 conv's value and gradients: the forward conv, the
    input-gradient (lhs-dilated) and the weight gradient (rhs-dilated, contracting the batch)."""
    from benchmarks.zoo import programs as zoo_programs

    batch, side, c_in, c_out = 2, 8, 3, 4
    w = jnp.ones((4, 4, c_in, c_out))
    x = jnp.ones((batch, side, side, c_in))

    def loss(x, w):
        y = jax.lax.conv_general_dilated(
            x, w, (2, 2), ((1, 1), (1, 1)), dimension_numbers=("NHWC", "HWIO", "NHWC")
        )
        return jnp.sum(jnp.sin(y))

    compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(x, w).compile()
    counts = zoo_programs.figures(compiled, batch)
    assert (counts["conv"], counts["conv_act"], counts["conv_wgrad"]) == (3, 2, 1)
    assert (counts["lhs_dilate"], counts["rhs_dilate"], counts["rhs_reversal"]) == (1, 1, 0)
    assert counts["conv_loop"] == 0 and counts["dot"] == 0
    forward = 2 * batch * (side // 2) ** 2 * c_out * 16 * c_in
    assert counts["conv_gflop"] * 1e9 >= 3 * forward and counts["flops"] > 0
