"""HBM <-> VMEM traffic of the row kernels, read off the kernels' own grids and BlockSpecs.

    forward_traffic(batch, features, dtype, generation, carry=False)  -> Traffic  (row_stats)
    backward_traffic(batch, features, dtype, generation)              -> Traffic  (scale_rows)
    pallas_traffic(fn, *shape_dtype_structs)                          -> Traffic  (any pallas_call)

The kernel is traced (``jax.make_jaxpr``, nothing runs) with the tiling ``choose_blocks`` picks for
the generation, and the ``pallas_call``'s grid mapping is read back: grid, block shapes and index
maps exactly as the kernel defines them. The grid is walked in Pallas TPU order (last axis
fastest). An input block is DMA'd from HBM on the first step and on every step whose block index
differs from the previous step's (the pipeline skips re-fetching an unchanged block); an output
block is written back each time its index is about to change and after the last step. So the
forward kernel's (8, block_b) stats tile, whose index depends only on the row block, moves once per
row block, not once per grid step.

Two byte counts per operand:

* ``upper``: every transfer moves a whole block (a ragged edge block counted in full);
* ``exact``: only the in-bounds part of each block (what the DMA of an edge block needs).

Both are logical bytes of the (B, D) view. Not modelled: the (8, 128) tiled HBM layout of narrow
arrays (a (B, 2) f32 operand occupies 128 lanes per row in HBM), the XLA ops around the kernel (the
backward's (8, B) broadcast of the scale), and megacore splitting (the row axis is the split axis;
every operand's index changes with the row block, so a split adds no transfers).

The minimum a fused kernel can move:

* forward: one read of g and one write of the (8, B) float32 stats;
* backward: one read of g, one write of dg and one read of the (8, B) float32 scale.
"""

import dataclasses
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np

from fastgp.kernels import penalty_tpu
from fastgp.kernels.stats_layout import STATS_ROWS
from fastgp.kernels.tiling import Blocks, choose_blocks

STATS_BYTES = 4  # the stats / scale rows are float32


@dataclasses.dataclass(frozen=True)
class OperandTraffic:
    role: str            # "in" or "out"
    shape: tuple
    dtype: str
    block: tuple
    transfers: int       # DMAs of a block between HBM and VMEM
    upper: int           # bytes, full blocks
    exact: int           # bytes, in-bounds part of each block


@dataclasses.dataclass(frozen=True)
class Traffic:
    grid: tuple
    operands: tuple      # OperandTraffic, inputs then outputs
    minimum: int         # bytes; see the module docstring
    blocks: Blocks | None = None

    @property
    def upper(self) -> int:
        return sum(o.upper for o in self.operands)

    @property
    def exact(self) -> int:
        return sum(o.exact for o in self.operands)

    @property
    def ratio_upper(self) -> float:
        return self.upper / self.minimum

    @property
    def ratio_exact(self) -> float:
        return self.exact / self.minimum


def _find_pallas_calls(jaxpr):
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            yield eqn
        for param in eqn.params.values():
            inner = getattr(param, "jaxpr", param)
            if hasattr(inner, "eqns"):
                yield from _find_pallas_calls(inner)


def _block_dims(block_shape):
    dims = []
    for b in block_shape:
        size = getattr(b, "block_size", b)
        dims.append(1 if size is None or not isinstance(size, (int, np.integer)) else int(size))
    return tuple(dims)


def _operand_traffic(mapping, grid, role):
    shape = tuple(mapping.array_aval.shape)
    dtype = jnp.dtype(mapping.array_aval.dtype)
    block = _block_dims(mapping.block_shape)
    index_map = mapping.index_map_jaxpr
    transfers, exact, previous = 0, 0, None
    for point in itertools.product(*(range(n) for n in grid)):
        index = tuple(int(v) for v in jax.core.eval_jaxpr(index_map.jaxpr, index_map.consts,
                                                          *point))
        if index == previous:
            continue
        previous = index
        transfers += 1
        exact += math.prod(max(0, min(b, n - i * b)) for i, b, n in zip(index, block, shape))
    itemsize = dtype.itemsize
    return OperandTraffic(role, shape, dtype.name, block, transfers,
                          transfers * math.prod(block) * itemsize, exact * itemsize)


def pallas_traffic(fn, *args, minimum=0, blocks=None) -> Traffic:
    """Traffic of the single ``pallas_call`` inside ``fn(*args)`` (args: ShapeDtypeStructs)."""
    calls = list(_find_pallas_calls(jax.make_jaxpr(fn)(*args).jaxpr))
    if len(calls) != 1:
        raise ValueError(f"expected exactly one pallas_call, found {len(calls)}")
    mapping = calls[0].params["grid_mapping"]
    grid = tuple(int(n) for n in mapping.grid)
    n_in = mapping.num_inputs
    operands = tuple(
        _operand_traffic(m, grid, "in" if n < n_in else "out")
        for n, m in enumerate(mapping.block_mappings[:n_in + mapping.num_outputs]))
    return Traffic(grid, operands, minimum, blocks)


def _blocks(batch, features, dtype, generation, blocks=None):
    if blocks is not None:
        return blocks
    return choose_blocks(batch, features, jnp.dtype(dtype).itemsize, generation)


def forward_traffic(batch, features, dtype=jnp.float32, generation=None, *, carry=False,
                    kind="wgan-gp", blocks=None) -> Traffic:
    """``row_stats`` on a (batch, features) g: fused sums, norms and penalties -> (8, B) stats.

    ``carry=True`` is a later leaf of a pytree: it also reads the earlier leaves' (8, B) stats.
    The minimum is one read of g plus one (8, B) float32 stats write (plus the carry read).
    ``blocks`` overrides the tiling (to evaluate another tiling policy).
    """
    dtype = jnp.dtype(dtype)
    blocks = _blocks(batch, features, dtype, generation, blocks)
    g = jax.ShapeDtypeStruct((batch, features), dtype)
    stats = jax.ShapeDtypeStruct((STATS_ROWS, batch), jnp.float32)
    stats_bytes = STATS_ROWS * batch * STATS_BYTES
    minimum = batch * features * dtype.itemsize + stats_bytes * (2 if carry else 1)
    if carry:
        fn = lambda g, c: penalty_tpu.row_stats(g, carry=c, kind=kind, blocks=blocks)
        return pallas_traffic(fn, g, stats, minimum=minimum, blocks=blocks)
    fn = lambda g: penalty_tpu.row_stats(g, kind=kind, blocks=blocks)
    return pallas_traffic(fn, g, minimum=minimum, blocks=blocks)


def backward_traffic(batch, features, dtype=jnp.float32, generation=None, *,
                     blocks=None) -> Traffic:
    """``scale_rows``: dg[b, :] = s[b] * g[b, :]. Minimum: read g, write dg, read (8, B) scale."""
    dtype = jnp.dtype(dtype)
    blocks = _blocks(batch, features, dtype, generation, blocks)
    minimum = 2 * batch * features * dtype.itemsize + STATS_ROWS * batch * STATS_BYTES
    fn = lambda s, g: penalty_tpu.scale_rows(s, g, blocks=blocks)
    return pallas_traffic(fn, jax.ShapeDtypeStruct((batch,), jnp.float32),
                          jax.ShapeDtypeStruct((batch, features), dtype),
                          minimum=minimum, blocks=blocks)


__all__ = ["OperandTraffic", "Traffic", "backward_traffic", "forward_traffic", "pallas_traffic"]
