"""benchmarks/traffic.py: bytes moved by the row kernels, read from their grids and BlockSpecs."""

import pathlib
import sys

import jax.numpy as jnp
import pytest

from fastgp.kernels.stats_layout import STATS_ROWS
from fastgp.kernels.tiling import SUPPORTED_GENERATIONS, choose_blocks

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
from traffic import backward_traffic, forward_traffic  # noqa: E402

ALIGNED = [(64, 2), (256, 2), (256, 8192), (1024, 8192)]


@pytest.mark.parametrize("generation", SUPPORTED_GENERATIONS)
@pytest.mark.parametrize("shape", ALIGNED, ids=str)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_aligned_shapes_move_exactly_the_minimum(shape, dtype, generation):
    blocks = choose_blocks(*shape, jnp.dtype(dtype).itemsize, generation)
    assert shape[0] % blocks.block_b == 0 and shape[1] % blocks.block_d == 0
    for traffic in (forward_traffic(*shape, dtype, generation),
                    backward_traffic(*shape, dtype, generation)):
        assert traffic.upper == traffic.exact == traffic.minimum


def test_minimum_definitions():
    b, d = 256, 12288
    fwd = forward_traffic(b, d, jnp.bfloat16, "v5e")
    bwd = backward_traffic(b, d, jnp.bfloat16, "v5e")
    assert fwd.minimum == b * d * 2 + STATS_ROWS * b * 4
    assert bwd.minimum == 2 * b * d * 2 + STATS_ROWS * b * 4


@pytest.mark.parametrize("carry", [False, True])
def test_stats_tile_moves_once_per_row_block(carry):
    """The (8, block_b) stats / carry / scale tiles are indexed by the row block only: one DMA per
    row block even though the feature axis has several grid steps."""
    fwd = forward_traffic(1024, 50000, jnp.float32, "v4", carry=carry)
    rows, cols = fwd.grid
    assert cols > 1 and rows > 1
    g, *stats = fwd.operands
    assert g.transfers == rows * cols
    assert [s.transfers for s in stats] == [rows] * len(stats)
    assert all(s.block == (STATS_ROWS, fwd.blocks.block_b) for s in stats)
    scale, g_in, dg = backward_traffic(1024, 50000, jnp.float32, "v4").operands
    assert scale.transfers == rows and g_in.transfers == dg.transfers == rows * cols


def test_ragged_edges_exact_is_minimum_upper_counts_full_blocks():
    b, d = 300, 1000
    fwd = forward_traffic(b, d, jnp.float32, "v5e")
    bb, bd = fwd.blocks.block_b, fwd.blocks.block_d
    assert b % bb and fwd.exact == fwd.minimum
    rows = -(-b // bb)
    cols = -(-d // bd)
    assert fwd.upper == rows * cols * bb * bd * 4 + rows * STATS_ROWS * bb * 4
    assert fwd.ratio_upper > 1.0


def test_feature_axis_is_split_evenly():
    """(256, 3072) f32 on v4: the 2048-lane budget becomes 2 x 1536, so no block is out of bounds."""
    fwd = forward_traffic(256, 3072, jnp.float32, "v4")
    assert fwd.blocks.block_d == 1536 and fwd.grid == (2, 2)
    assert fwd.upper == fwd.exact == fwd.minimum


def test_ragged_feature_axis_counts_only_the_edge_overhang():
    """(256, 3000) f32 on v4: 2 x 1536 lanes, the last block has 72 lanes out of bounds."""
    fwd = forward_traffic(256, 3000, jnp.float32, "v4")
    assert fwd.blocks.block_d == 1536 and fwd.grid == (2, 2)
    assert fwd.exact == fwd.minimum
    assert fwd.operands[0].upper == 2 * 2 * 128 * 1536 * 4