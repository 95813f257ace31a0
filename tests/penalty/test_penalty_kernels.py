"""Pallas TPU kernels (interpret and TPU-interpret modes) against float64 numpy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from fastgp import _jax_private
from fastgp._penalty import binding as backends
from fastgp._penalty.rowops import RowOptions, norms_and_penalties
from fastgp.kernels.penalty import Blocks, lane_blocks, lane_sumsq, row_blocks, row_sumsq
from fastgp.kernels.penalty.tiling import VMEM_TILES, generation_budget
from fastgp.kernels.tiling import SUPPORTED_GENERATIONS, chip_info
from oracles import norms64, penalties64

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
MODES = {"interpret": True, "tpu-interpret": pltpu.InterpretParams()}


def _draw(seed, shape, dtype):
    g = np.random.default_rng(seed).standard_normal(shape) * 3.0
    g = jnp.asarray(g, DTYPES[dtype])
    return g, np.asarray(g.astype(jnp.float32), np.float64)  # oracle sees the rounded values


def _small(batch, length, splits, multiple):
    """A deliberately small tiling: a ragged multi-block grid, split in two or not."""
    return Blocks(
        batch if batch <= 128 else 128, length if length <= multiple else multiple, splits, 16 << 20
    )


@given(
    batch=st.integers(1, 300),
    features=st.integers(1, 700),
    dtype=st.sampled_from(sorted(DTYPES)),
    mode=st.sampled_from(sorted(MODES)),
    tiling=st.sampled_from(["default", "split", "unsplit"]),
    seed=st.integers(0, 2**16),
)
def test_row_sumsq_matches_float64(batch, features, dtype, mode, tiling, seed):
    g, g64 = _draw(seed, (batch, features), dtype)
    blocks = (
        row_blocks(batch, features, g.dtype.itemsize)
        if tiling == "default"
        else _small(batch, features, 2 if tiling == "split" else 1, 128)
    )
    sums = np.asarray(row_sumsq(g, blocks=blocks, interpret=MODES[mode]))
    assert sums.dtype == np.float32 and sums.shape == (batch,)
    np.testing.assert_allclose(sums, np.sum(g64**2, axis=1), rtol=1e-6)


@given(
    lead=st.lists(st.integers(1, 40), min_size=0, max_size=2),
    sublanes=st.integers(1, 9),
    batch=st.integers(1, 300),
    dtype=st.sampled_from(sorted(DTYPES)),
    mode=st.sampled_from(sorted(MODES)),
    tiling=st.sampled_from(["default", "split", "unsplit"]),
    seed=st.integers(0, 2**16),
)
def test_lane_sumsq_matches_float64(lead, sublanes, batch, dtype, mode, tiling, seed):
    shape = (*lead, sublanes, batch)
    g, g64 = _draw(seed, shape, dtype)
    rows = int(np.prod(lead))
    blocks = (
        lane_blocks(rows, sublanes, batch)
        if tiling == "default"
        else _small(batch, rows, 2 if tiling == "split" else 1, 8)
    )
    sums = np.asarray(lane_sumsq(g, blocks=blocks, interpret=MODES[mode]))
    assert sums.dtype == np.float32 and sums.shape == (batch,)
    np.testing.assert_allclose(sums, np.sum(g64.reshape(-1, batch) ** 2, axis=0), rtol=1e-6)


LEAF_SHAPES = [[(5, 3, 8, 8), (5, 7)], [(5, 9, 9, 1), (5,)], [(5, 2, 3, 4), (5, 6, 7)]]


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("shapes", LEAF_SHAPES, ids=str)
@pytest.mark.parametrize("kind", ["wgan-gp", "wgan-lp", "r1"])
def test_leaves_of_every_view_sum_into_one_norm(mode, shapes, kind):
    """Image leaves (lanes view), dense leaves (rows view), other ranks (reshaped rows), mixed
    dtypes: one norm and penalty per sample, as float64 computes them."""
    leaves = [_draw(i, s, "float32" if i else "bfloat16") for i, s in enumerate(shapes)]
    norm, pen = norms_and_penalties(tuple(g for g, _ in leaves), RowOptions(kind, 1.5, mode))
    norm64 = norms64([g64 for _, g64 in leaves])
    np.testing.assert_allclose(np.asarray(norm), norm64, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(pen), penalties64(norm64, kind, 1.5), rtol=1e-5)


def test_image_leaves_take_the_lanes_view():
    assert backends.image_channel_axis((64, 3, 64, 64)) == 1
    assert backends.image_channel_axis((64, 64, 64, 3)) == 3
    assert backends.image_channel_axis((8, 1, 8, 8)) == 1
    assert backends.image_channel_axis((8, 8, 8, 8)) is None
    assert backends.image_channel_axis((8, 3, 64)) is None
    nchw = jax.make_jaxpr(backends.resolve("interpret"))(jnp.zeros((4, 3, 16, 16)))
    nhwc = jax.make_jaxpr(backends.resolve("interpret"))(jnp.zeros((4, 16, 16, 3)))
    for jaxpr in (nchw, nhwc):
        (call,) = [
            e
            for e in equations(jaxpr.jaxpr)
            if e.primitive.name in ("jit", "pjit") and e.params["name"] == "lane_sumsq"
        ]
        assert call.invars[0].aval.shape == (16, 16, 3, 4)  # (H, W, C, B)


def equations(jaxpr):
    """Every equation of ``jaxpr`` and of the jaxprs nested in its equations' parameters (the
    kernels sit inside the custom_partitioning op that partitions them)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for param in eqn.params.values():
            inner = getattr(param, "jaxpr", param)
            if hasattr(inner, "eqns"):
                yield from equations(inner)


@pytest.mark.parametrize("view", ["rows", "lanes"])
def test_bf16_long_reductions_accumulate_in_float32(view):
    """2**18 bf16 values per sample: float32 accumulation keeps the norm within 1e-3 of float64."""
    shape = (2, 1 << 18) if view == "rows" else (1 << 15, 8, 2)
    g, g64 = _draw(7, shape, "bfloat16")
    if view == "rows":
        sums = row_sumsq(g, blocks=row_blocks(shape[0], shape[1], 2), interpret=True)
    else:
        sums = lane_sumsq(g, blocks=lane_blocks(*shape), interpret=True)
    norm = np.sqrt(np.asarray(sums, np.float64))
    sums64 = np.sum(g64**2, axis=1) if view == "rows" else np.sum(g64**2, axis=(0, 1))
    np.testing.assert_allclose(norm, np.sqrt(sums64), rtol=1e-3)
    # A true bf16 accumulator is far off: the test can tell the difference.
    squares = (
        (np.asarray(g) * np.asarray(g)).reshape(-1, 2)
        if view == "lanes"
        else (np.asarray(g) * np.asarray(g)).T
    )
    bf16_norm = np.sqrt(squares.sum(axis=0, dtype=squares.dtype).astype(np.float64))
    assert np.max(np.abs(bf16_norm / np.sqrt(sums64) - 1)) > 1e-1


def test_nonfinite_gradients_stay_in_their_sample():
    g = np.ones((20, 300), np.float32)
    g[3, 17] = np.nan
    g[11, 299] = np.inf
    rows = np.asarray(
        row_sumsq(jnp.asarray(g), blocks=Blocks(20, 128, 2, 16 << 20), interpret=True)
    )
    lanes = np.asarray(
        lane_sumsq(
            jnp.asarray(g.T.reshape(30, 10, 20)), blocks=Blocks(20, 8, 2, 16 << 20), interpret=True
        )
    )
    for sums in (rows, lanes):
        bad = ~np.isfinite(sums)
        assert bad.tolist() == [i in (3, 11) for i in range(20)]
        np.testing.assert_allclose(sums[~bad], 300.0, rtol=1e-6)


GARBAGE = 3.0


@pytest.fixture
def finite_garbage(monkeypatch):
    """Out-of-bounds block contents become a finite value instead of interpret mode's NaN, as on
    hardware, where they are whatever the buffer held: only masking (not NaN propagation)
    keeps them out of the sums."""
    monkeypatch.setattr(
        _jax_private.resolve("pallas_primitives"),
        "uninitialized_value",
        lambda shape, dtype: jnp.full(shape, GARBAGE, dtype),
    )
    monkeypatch.setattr(
        _jax_private.resolve("tpu_interpret_utils"),
        "get_uninitialized_value",
        lambda dtype, memory: GARBAGE,
    )


def _unmasked_block_sum(g, block, interpret):
    """Sums every element of every block, edges included: what a kernel without masks computes."""

    def kernel(g_ref, out_ref):
        @pl.when(pl.program_id(0) == 0)
        def _init():
            out_ref[...] = jnp.zeros_like(out_ref)

        out_ref[...] += jnp.sum(g_ref[...], keepdims=True)

    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((1, 1), jnp.float32),
        grid=(pl.cdiv(g.shape[1], block),),
        in_specs=[pl.BlockSpec((g.shape[0], block), lambda k: (0, k))],
        out_specs=pl.BlockSpec((1, 1), lambda k: (0, 0)),
        interpret=interpret,
    )(g)[0, 0]


@pytest.mark.parametrize("mode", sorted(MODES))
def test_ragged_tails_are_masked_against_finite_garbage(finite_garbage, mode):
    g, g64 = _draw(3, (12, 300), "float32")
    # The garbage reaches the blocks: an unmasked sum sees it.
    assert float(_unmasked_block_sum(g, 128, MODES[mode])) == pytest.approx(
        np.sum(g64) + GARBAGE * 12 * (384 - 300), rel=1e-5
    )
    rows = row_sumsq(g, blocks=Blocks(12, 128, 2, 16 << 20), interpret=MODES[mode])
    np.testing.assert_allclose(np.asarray(rows), np.sum(g64**2, axis=1), rtol=1e-6)
    h, h64 = _draw(4, (37, 3, 12), "bfloat16")  # 37 rows in blocks of 8, split in two
    lanes = lane_sumsq(h, blocks=Blocks(12, 8, 2, 16 << 20), interpret=MODES[mode])
    np.testing.assert_allclose(np.asarray(lanes), np.sum(h64**2, axis=(0, 1)), rtol=1e-6)


@pytest.mark.parametrize("generation", (None,) + SUPPORTED_GENERATIONS)
@pytest.mark.parametrize(
    "batch,features", [(1, 1), (7, 3), (64, 12288), (129, 100_000), (1000, 3 * 64 * 64), (4096, 2)]
)
@pytest.mark.parametrize("itemsize", [2, 4])
def test_row_blocks_obey_tpu_layout_rules(generation, batch, features, itemsize):
    blocks = row_blocks(batch, features, itemsize, generation)
    sublanes = 8 * (4 // itemsize)
    assert blocks.batch == batch or (blocks.batch % 128 == 0 and blocks.batch % sublanes == 0)
    assert blocks.reduce == features or blocks.reduce % 128 == 0
    assert blocks.batch <= batch and blocks.reduce <= features
    # Input double-buffered plus two float32 temporaries.
    tile = max(blocks.batch, sublanes) * max(blocks.reduce, 128)
    assert 2 * tile * itemsize + 2 * tile * 4 <= blocks.vmem_limit_bytes


@pytest.mark.parametrize("generation", SUPPORTED_GENERATIONS)
def test_the_kernels_ask_for_the_scoped_vmem_their_blocks_need_not_the_cores(generation):
    """The kernel asks for its VMEM_TILES float32 blocks and 1 MiB of scoped VMEM, less than 3/4
    of the core's VMEM on every chip (a 3/4 request had compiled steps move more bytes)."""
    tile, limit = generation_budget(generation)
    assert limit == VMEM_TILES * tile + (1 << 20)
    assert limit < chip_info(generation).vmem_capacity_bytes * 3 // 4
    for blocks in (row_blocks(64, 12288, 2, generation), lane_blocks(4096, 3, 64, generation)):
        assert blocks.vmem_limit_bytes == limit


@pytest.mark.parametrize("generation", (None,) + SUPPORTED_GENERATIONS)
@pytest.mark.parametrize(
    "rows,sublanes,batch", [(1, 1, 1), (4096, 3, 64), (1024, 3, 300), (50_000, 1, 8), (3, 5, 4096)]
)
def test_lane_blocks_obey_tpu_layout_rules(generation, rows, sublanes, batch):
    blocks = lane_blocks(rows, sublanes, batch, generation)
    assert blocks.batch == batch or blocks.batch % 128 == 0
    assert blocks.reduce <= rows and (blocks.reduce == rows or blocks.reduce % 8 == 0)
    tile = blocks.reduce * -(-sublanes // 8) * 8 * -(-blocks.batch // 128) * 128 * 4
    assert 4 * tile <= blocks.vmem_limit_bytes


@pytest.mark.parametrize(
    "generation,splits", [("v4", 2), ("v5p", 2), (None, 2), ("v5e", 1), ("v6e", 1), ("7x", 1)]
)
def test_megacore_chips_split_the_reduction_of_a_one_block_batch(generation, splits):
    assert lane_blocks(4096, 3, 64, generation).splits == splits
    assert row_blocks(128, 1 << 20, 4, generation).splits == splits
    # Two batch blocks already give each core one; a one-block reduction has nothing to split.
    assert lane_blocks(4096, 3, 256, generation).splits == 1
    assert row_blocks(64, 128, 4, generation).splits == 1
