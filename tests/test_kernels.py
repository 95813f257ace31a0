"""Pallas kernels (interpret and TPU-interpret modes) against float64 numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.experimental.pallas import tpu as pltpu

from fastgp.kernels import Blocks, choose_blocks, row_dot, row_stats, scale_rows
from fastgp.kernels.stats_layout import NORM_ROW, PENALTY_ROW, SUM_ROW
from fastgp.kernels.tiling import SUPPORTED_GENERATIONS
from oracles import penalties64

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
OUTPUT_RTOL = {"float32": 2e-7, "bfloat16": 2 ** -8, "float16": 2 ** -10}
OUTPUT_ATOL = {"float32": 1e-30, "bfloat16": 1e-30, "float16": 2.0 ** -24}  # f16 subnormals
MODES = {"interpret": True, "tpu-interpret": pltpu.InterpretParams()}


def _tiling(batch, features, small):
    """Either the default tiling or a deliberately small one that makes a ragged multi-tile grid."""
    if not small:
        return None
    block_b = batch if batch <= 128 else 128
    return Blocks(block_b, features if features <= 128 else 128, 16 << 20)


def _draw(seed, batch, features, dtype):
    g = np.random.default_rng(seed).standard_normal((batch, features)) * 3.0
    g = jnp.asarray(g, DTYPES[dtype])
    return g, np.asarray(g.astype(jnp.float32), np.float64)  # oracle sees the rounded values


@given(batch=st.integers(1, 300), features=st.integers(1, 700),
       dtype=st.sampled_from(sorted(DTYPES)), mode=st.sampled_from(sorted(MODES)),
       kind=st.sampled_from(["wgan-gp", "wgan-lp", "r1"]), target=st.sampled_from([1.0, 2.5]),
       small=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_row_stats_matches_float64(batch, features, dtype, mode, kind, target, small, seed):
    g, g64 = _draw(seed, batch, features, dtype)
    stats = np.asarray(row_stats(g, kind=kind, target=target,
                                 blocks=_tiling(batch, features, small), interpret=MODES[mode]))
    sumsq64 = np.sum(g64 ** 2, axis=1)
    norm64 = np.sqrt(sumsq64)
    np.testing.assert_allclose(stats[SUM_ROW], sumsq64, rtol=1e-6)
    np.testing.assert_allclose(stats[NORM_ROW], norm64, rtol=1e-6)
    # (n/t - 1)^2 cancels near n = t: bound its error by the norm's, propagated.
    penalty64 = penalties64(norm64, kind, target)
    bound = 1e-6 * penalty64 + 4e-6 * (1 + norm64 / target) ** 2
    assert np.all(np.abs(stats[PENALTY_ROW] - penalty64) <= bound)
    assert not np.any(stats[3:]), "unused stats rows must be zero"


@given(batch=st.integers(1, 200), features=st.integers(1, 600),
       dtype=st.sampled_from(sorted(DTYPES)), mode=st.sampled_from(sorted(MODES)),
       small=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_scale_rows_and_row_dot_match_float64(batch, features, dtype, mode, small, seed):
    g, g64 = _draw(seed, batch, features, dtype)
    h, h64 = _draw(seed + 1, batch, features, dtype)
    scale = np.random.default_rng(seed).standard_normal(batch).astype(np.float32)
    blocks = _tiling(batch, features, small)
    out = scale_rows(jnp.asarray(scale), g, blocks=blocks, interpret=MODES[mode])
    assert out.dtype == g.dtype
    np.testing.assert_allclose(np.asarray(out.astype(jnp.float32)), scale[:, None] * g64,
                               rtol=OUTPUT_RTOL[dtype], atol=OUTPUT_ATOL[dtype])
    dots = row_dot(g, h, blocks=blocks, interpret=MODES[mode])
    exact = np.sum(g64 * h64, axis=1)
    scale_of_terms = np.sqrt(np.sum(g64 ** 2, axis=1) * np.sum(h64 ** 2, axis=1))
    assert np.all(np.abs(np.asarray(dots) - exact) <= 1e-6 * scale_of_terms)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_carry_chains_leaves_into_one_norm(mode):
    a, a64 = _draw(0, 37, 300, "float32")
    b, b64 = _draw(1, 37, 129, "bfloat16")
    first = row_stats(a, interpret=MODES[mode])
    stats = np.asarray(row_stats(b, carry=first, kind="wgan-gp", interpret=MODES[mode]))
    norm64 = np.sqrt(np.sum(a64 ** 2, axis=1) + np.sum(b64 ** 2, axis=1))
    np.testing.assert_allclose(stats[NORM_ROW], norm64, rtol=1e-6)


def test_bf16_long_rows_accumulate_in_float32():
    """D = 2**18 bf16 values: float32 accumulation keeps the norm within 1e-3 of float64."""
    features = 1 << 18
    g, g64 = _draw(7, 2, features, "bfloat16")
    norm = np.asarray(row_stats(g, kind="r1", interpret=True)[NORM_ROW])
    norm64 = np.sqrt(np.sum(g64 ** 2, axis=1))
    np.testing.assert_allclose(norm, norm64, rtol=1e-3)
    # The same reduction accumulated in bfloat16 is far off: the test can tell the difference.
    squares = np.asarray(g) * np.asarray(g)
    bf16_norm = np.sqrt(squares.sum(axis=1, dtype=squares.dtype).astype(np.float64))
    assert np.max(np.abs(bf16_norm / norm64 - 1)) > 1e-2


def test_nonfinite_gradients_stay_in_their_row():
    g = np.ones((20, 300), np.float32)
    g[3, 17] = np.nan
    g[11, 299] = np.inf
    stats = np.asarray(row_stats(jnp.asarray(g), kind="wgan-gp",
                                 blocks=Blocks(20, 128, 16 << 20), interpret=True))
    bad = ~np.isfinite(stats[NORM_ROW])
    assert bad.tolist() == [i in (3, 11) for i in range(20)]
    np.testing.assert_allclose(stats[NORM_ROW][~bad], np.sqrt(300.0), rtol=1e-6)


@pytest.mark.parametrize("generation", (None,) + SUPPORTED_GENERATIONS)
@pytest.mark.parametrize("batch,features", [(1, 1), (7, 3), (64, 12288), (129, 100_000),
                                            (1000, 3 * 64 * 64), (4096, 2)])
@pytest.mark.parametrize("itemsize", [2, 4])
def test_tiles_obey_tpu_layout_rules(generation, batch, features, itemsize):
    blocks = choose_blocks(batch, features, itemsize, generation)
    sublanes = 8 * (4 // itemsize)
    assert blocks.block_b == batch or blocks.block_b % 128 == 0
    assert blocks.block_b == batch or blocks.block_b % sublanes == 0
    assert blocks.block_d == features or blocks.block_d % 128 == 0
    assert blocks.block_b <= batch and blocks.block_d <= features
    # Backward working set: in/out double-buffered plus three float32 temporaries.
    tile = max(blocks.block_b, sublanes) * max(blocks.block_d, 128)
    assert 4 * tile * itemsize + 3 * tile * 4 <= blocks.vmem_limit_bytes
