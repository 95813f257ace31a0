"""What the TPU attention kernels share: the grid layout, block specs, row helpers, and calls
described by their operands' kinds."""

import dataclasses
import functools
import math
import types
from collections.abc import Callable, Sequence
from typing import Any, NotRequired, TypedDict, TypeVar, cast

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ..tiling import LANES
from ..types import Interpret
from .tiles import Tiles


def lanes(x: jax.Array, n: int) -> jax.Array:
    """A (rows, 128) lane-broadcast column as (rows, n)."""
    if n == LANES:
        return x
    if n < LANES:
        return x[:, :n]
    reps = -(-n // LANES)
    tiled = jnp.tile(x, (1, reps))
    return tiled if n == reps * LANES else tiled[:, :n]


def row_to_col(row: jax.Array) -> jax.Array:
    """A (1, n) lane-dense row as a (n, 128) lane-broadcast column."""
    return jnp.broadcast_to(row, (LANES, row.shape[1])).T


def col_to_row(col: jax.Array) -> jax.Array:
    """A (n, 128) lane-broadcast column as a (1, n) lane-dense row."""
    return col.T[:1, :]


def row_sums(tile: jax.Array) -> jax.Array:
    """(rows, 1) float32 sums of a tile along its lanes."""
    return jnp.sum(tile, axis=1, keepdims=True)


def named(refs: Sequence[Any], names: str) -> types.SimpleNamespace:
    """A kernel's positional refs by the space-separated ``names`` of its call's operands,
    outputs and scratch, in order."""
    keys = names.split()
    assert len(keys) == len(refs), (keys, len(refs))
    return types.SimpleNamespace(**dict(zip(keys, refs, strict=True)))


def when(cond: jax.Array | bool, body: Callable[[], None]) -> None:
    if cond is True:
        body()
    else:
        pl.when(cond)(body)


@dataclasses.dataclass(frozen=True)
class Layout:
    """Shapes, blocks and the causal block arithmetic shared by the four kernels."""

    batch: int
    heads: int
    tq: int
    tk: int
    d: int
    dv: int
    bq: int
    bk: int
    causal: bool
    q_offset: int = 0  # the first query's position among the keys (a sequence shard's start)

    @property
    def nq(self) -> int:
        return self.tq // self.bq

    @property
    def nk(self) -> int:
        return self.tk // self.bk

    # lax.div, not //: jnp's floor division lowers through sign(), which Mosaic lowers only when
    # the compiling host is itself a TPU (operands here are non-negative, so they agree).
    def last_k(self, i: jax.Array) -> jax.Array:
        """The last key block that query block i sees (causal), at most the last block."""
        last = lax.div(self.q_offset + i * self.bq + (self.bq - 1), self.bk)
        return jnp.minimum(last, self.nk - 1)

    def first_q(self, j: jax.Array) -> jax.Array:
        """The first query block that sees key block j (causal)."""
        return lax.div(jnp.maximum(j * self.bk - self.q_offset, 0), self.bq)

    def visits(self, i: jax.Array, j: jax.Array) -> jax.Array | bool:
        """Whether block (query i, key j) holds a visible pair: j * bk <= the block's last row."""
        if not self.causal:
            return True
        return j * self.bk <= self.q_offset + i * self.bq + (self.bq - 1)

    def k_index(self, i: jax.Array, j: jax.Array) -> jax.Array:
        """Key block to fetch at query-major step (i, j): a skipped block repeats the last used."""
        return jnp.minimum(j, self.last_k(i)) if self.causal else j

    def q_index(self, j: jax.Array, i: jax.Array) -> jax.Array:
        """Query block to fetch at key-major step (j, i): a skipped block is the first used."""
        if not self.causal:
            return i
        return jnp.minimum(jnp.maximum(i, self.first_q(j)), self.nq - 1)

    def visited(self) -> int:
        """Visited (query block, key block) pairs per (b, h)."""
        if not self.causal:
            return self.nq * self.nk
        last_rows = (self.q_offset + i * self.bq + self.bq - 1 for i in range(self.nq))
        return sum(min(self.nk, row // self.bk + 1) for row in last_rows)

    def elements(self) -> int:
        return self.batch * self.heads * self.visited() * self.bq * self.bk

    def streamed(self) -> int:
        """Block fetches of the streamed side over the whole grid."""
        return self.batch * self.heads * self.visited()

    def valid(self, key_row: jax.Array, i: jax.Array, j: jax.Array) -> jax.Array:
        """(bq, bk) validity of a query-major score tile from the (1, bk) int32 key mask."""
        shape = (self.bq, self.bk)
        valid = jnp.broadcast_to(key_row, shape) != 0
        if self.causal:
            row = self.q_offset + i * self.bq + lax.broadcasted_iota(jnp.int32, shape, 0)
            col = j * self.bk + lax.broadcasted_iota(jnp.int32, shape, 1)
            valid = jnp.logical_and(valid, col <= row)
        return valid

    def valid_t(self, key_col: jax.Array, j: jax.Array, i: jax.Array) -> jax.Array:
        """(bk, bq) validity of a transposed tile from the (bk, 128) float32 key-mask column."""
        shape = (self.bk, self.bq)
        valid = lanes(key_col, self.bq) > 0.5
        if self.causal:
            key = j * self.bk + lax.broadcasted_iota(jnp.int32, shape, 0)
            query = self.q_offset + i * self.bq + lax.broadcasted_iota(jnp.int32, shape, 1)
            valid = jnp.logical_and(valid, key <= query)
        return valid


def layout(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    block_q: int,
    block_k: int,
    causal: bool,
    q_offset: int = 0,
) -> Layout:
    batch, heads, tq, d = q.shape
    tk, dv = k.shape[2], v.shape[3]
    bq, bk = min(block_q, tq), min(block_k, tk)
    return Layout(batch, heads, tq, tk, d, dv, bq, bk, causal, q_offset)


def nbytes(*arrays: jax.Array) -> int:
    return sum(a.size * a.dtype.itemsize for a in arrays)


def compiler_params(vmem_limit_bytes: int | None) -> pltpu.CompilerParams:
    return pltpu.CompilerParams(
        dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"),
        vmem_limit_bytes=vmem_limit_bytes,
    )


def out(shape: tuple[int, ...], dtype: Any, like: jax.Array) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype, manual_axis_type=jax.typeof(like).manual_axis_type)


# --- Block specs ----------------------------------------------------------------------------
# Query-major grid (b, h, i, j); key-major grid (b, h, j, i).


def q_rows(lay: Layout, width: int) -> pl.BlockSpec:  # (B, H, Tq, width), query-major
    return pl.BlockSpec((None, None, lay.bq, width), lambda b, h, i, j: (b, h, i, 0))


def q_stat(lay: Layout) -> pl.BlockSpec:  # (B, H, 1, Tq), query-major
    return pl.BlockSpec((None, None, 1, lay.bq), lambda b, h, i, j: (b, h, 0, i))


def k_rows_streamed(lay: Layout, width: int) -> pl.BlockSpec:  # (B, H, Tk, width)
    return pl.BlockSpec(
        (None, None, lay.bk, width), lambda b, h, i, j: (b, h, lay.k_index(i, j), 0)
    )


def k_mask_streamed(lay: Layout) -> pl.BlockSpec:  # (B, 1, Tk)
    return pl.BlockSpec((None, 1, lay.bk), lambda b, h, i, j: (b, 0, lay.k_index(i, j)))


def k_rows(lay: Layout, width: int) -> pl.BlockSpec:  # (B, H, Tk, width), key-major
    return pl.BlockSpec((None, None, lay.bk, width), lambda b, h, j, i: (b, h, j, 0))


def k_mask(lay: Layout) -> pl.BlockSpec:  # (B, 1, Tk), key-major
    return pl.BlockSpec((None, 1, lay.bk), lambda b, h, j, i: (b, 0, j))


def q_rows_streamed(lay: Layout, width: int) -> pl.BlockSpec:  # (B, H, Tq, width), key-major
    return pl.BlockSpec(
        (None, None, lay.bq, width), lambda b, h, j, i: (b, h, lay.q_index(j, i), 0)
    )


def q_stat_streamed(lay: Layout) -> pl.BlockSpec:  # (B, H, 1, Tq), key-major
    return pl.BlockSpec((None, None, 1, lay.bq), lambda b, h, j, i: (b, h, 0, lay.q_index(j, i)))


# --- Entry points ---------------------------------------------------------------------------


class Static(TypedDict):
    """The keywords of every kernel entry point.

    scale: multiplies q.k. causal: query i sees key j only if j <= q_offset + i. block_q,
    block_k: must divide Tq and Tk (``tiling.blocks``). interpret: Pallas interpret mode (True or
    ``pltpu.InterpretParams``; False by default). vmem_limit_bytes: the TPU's scoped-VMEM limit
    (``tiling.blocks(...).vmem_limit_bytes``; None: Mosaic's default). q_offset: the first
    query's position among the keys (causal only; a sequence shard's start), 0 by default.
    num_warps, num_stages: the Triton kernels' launch (``gpu.NUM_WARPS`` and ``gpu.NUM_STAGES``
    by default; the TPU kernels ignore them).
    """

    scale: float
    causal: bool
    block_q: int
    block_k: int
    interpret: NotRequired[Interpret]
    vmem_limit_bytes: NotRequired[int | None]
    q_offset: NotRequired[int]
    num_warps: NotRequired[int]
    num_stages: NotRequired[int]


STATIC = tuple(Static.__annotations__)
F = TypeVar("F", bound=Callable[..., Any])


def entry(fn: F) -> F:
    """A kernel entry point: jitted, its ``Static`` keywords static."""
    return cast(F, jax.jit(fn, static_argnames=STATIC))


def layout_of(arrays: Sequence[jax.Array], static: Static) -> Layout:
    """The layout of an entry point's (q, k, v, ...) under its keywords."""
    q, k, v = arrays[:3]
    return layout(
        q, k, v, static["block_q"], static["block_k"], static["causal"], static.get("q_offset", 0)
    )


def stat_rows(x: jax.Array) -> jax.Array:
    """(B, H, T) -> (B, H, 1, T) float32, the lane-dense layout the kernels read."""
    return x.astype(jnp.float32).reshape(x.shape[0], x.shape[1], 1, x.shape[2])


def key_rows(key_mask: jax.Array) -> jax.Array:
    return key_mask.astype(jnp.int32).reshape(key_mask.shape[0], 1, key_mask.shape[1])


# --- Calls described by their operands' kinds -----------------------------------------------
# Each operand is a kind: "qd"/"qv" query rows of width D/Dv, "kd"/"kv" key rows, "qs" a query
# statistic (B, H, 1, Tq) float32 row, "km" the (B, 1, Tk) int32 key mask. Its block spec and its
# bytes follow from the grid: the resident side is read once, the streamed side once per visited
# block pair.


def spec(lay: Layout, kind: str, key_major: bool) -> pl.BlockSpec:
    """The block spec of an operand (or output) of ``kind`` on a query- or key-major grid."""
    if kind == "qs":
        return q_stat_streamed(lay) if key_major else q_stat(lay)
    if kind == "km":
        return k_mask(lay) if key_major else k_mask_streamed(lay)
    width = lay.d if kind[1] == "d" else lay.dv
    if kind[0] == "q":
        return q_rows_streamed(lay, width) if key_major else q_rows(lay, width)
    return k_rows(lay, width) if key_major else k_rows_streamed(lay, width)


def bytes_read(lay: Layout, operands: Sequence[jax.Array], kinds: str, key_major: bool) -> int:
    """HBM bytes the grid reads for ``operands`` of ``kinds`` (space-separated)."""
    total = 0
    for x, kind in zip(operands, kinds.split(), strict=True):
        per_token = x.dtype.itemsize * (x.shape[-1] if kind[1] in "dv" else 1)
        queries = kind[0] == "q"
        if queries == key_major:  # the streamed side
            total += lay.streamed() * (lay.bq if queries else lay.bk) * per_token
        else:
            total += lay.batch * lay.heads * (lay.tq if queries else lay.tk) * per_token
    return total


@dataclasses.dataclass(frozen=True)
class Call:
    """One kernel's grid: its operands' and outputs' kinds, scratch, and matmul depth per score
    (flops = 2 x scores x depth; one exp per score)."""

    kinds: str
    out_kinds: str
    scratch: Sequence[Any]
    depth: int
    key_major: bool = False
    rescales: bool = False  # one more exp per row and visited key block (online softmax)


def tiled_call(
    kernel: Callable[..., None],
    lay: Layout,
    call: Call,
    operands: Sequence[jax.Array],
    out_shapes: Sequence[jax.ShapeDtypeStruct],
    static: Static,
) -> Any:
    """``pl.pallas_call`` of ``kernel(*refs, lay=, t=)`` on the query- or key-major grid, ``t``
    the tile algebra in that orientation, with its cost estimate from the loop counts."""
    kinds, out_kinds = call.kinds.split(), call.out_kinds.split()
    grid_tail = (lay.nk, lay.nq) if call.key_major else (lay.nq, lay.nk)
    written = sum(math.prod(s.shape) * jnp.dtype(s.dtype).itemsize for s in out_shapes)
    e = lay.elements()
    return pl.pallas_call(
        functools.partial(kernel, lay=lay, t=Tiles(static["scale"], call.key_major)),
        out_shape=tuple(out_shapes),
        grid=(lay.batch, lay.heads, *grid_tail),
        in_specs=[spec(lay, kind, call.key_major) for kind in kinds],
        out_specs=tuple(spec(lay, kind, call.key_major) for kind in out_kinds),
        scratch_shapes=list(call.scratch),
        compiler_params=compiler_params(static.get("vmem_limit_bytes")),
        cost_estimate=pl.CostEstimate(
            flops=2 * e * call.depth,
            transcendentals=e + (lay.streamed() * lay.bq if call.rescales else 0),
            bytes_accessed=bytes_read(lay, operands, call.kinds, call.key_major) + written,
        ),
        interpret=static.get("interpret", False),
    )(*operands)


def grid_steps(
    lay: Layout,
    key_major: bool,
    init: Callable[[], None],
    step: Callable[[jax.Array, jax.Array], None],
    finish: Callable[[], None],
) -> None:
    """A kernel's body over its grid (b, h, outer, inner): ``init`` at the first inner block,
    ``step(i, j)`` on each visited (query block i, key block j), ``finish`` at the last."""
    outer, inner = pl.program_id(2), pl.program_id(3)
    i, j = (inner, outer) if key_major else (outer, inner)
    pl.when(inner == 0)(init)
    when(lay.visits(i, j), functools.partial(step, i, j))
    pl.when(inner == (lay.nq if key_major else lay.nk) - 1)(finish)


def zero(*refs: Any) -> None:
    for ref in refs:
        ref[...] = jnp.zeros(ref.shape, jnp.float32)


def o_and_lse(lay: Layout, q: jax.Array) -> tuple[jax.ShapeDtypeStruct, jax.ShapeDtypeStruct]:
    """The out shapes of an (o, lse)-shaped result: (B, H, Tq, Dv) in q's dtype, lse rows."""
    return (
        out((lay.batch, lay.heads, lay.tq, lay.dv), q.dtype, q),
        out((lay.batch, lay.heads, 1, lay.tq), jnp.float32, q),
    )


def row_scratch(lay: Layout, rows: int, width: int) -> list[Any]:
    """``rows`` lane-broadcast (block_q, 128) float32 columns and a (block_q, width) accumulator."""
    return [
        *(pltpu.VMEM((lay.bq, LANES), jnp.float32),) * rows,
        pltpu.VMEM((lay.bq, width), jnp.float32),
    ]


def key_scratch(lay: Layout) -> list[Any]:
    """The key-major kernels' scratch: the key-mask column and the (block_k, D), (block_k, Dv)
    accumulators."""
    return [pltpu.VMEM((lay.bk, w), jnp.float32) for w in (LANES, lay.d, lay.dv)]


def key_major(
    lay: Layout,
    r: types.SimpleNamespace,
    t: Tiles,
    outputs: tuple[Any, Any],
    step: Callable[[jax.Array, jax.Array], None],
) -> None:
    """A key-major kernel's body: ``step`` adds to the acc_k and acc_v scratch over the query
    blocks (the key mask as the key_col scratch column), written as (scale acc_k, acc_v) to
    ``outputs``."""
    out_k, out_v = outputs

    def init() -> None:
        r.key_col[...] = row_to_col((r.km[...] != 0).astype(jnp.float32))
        zero(r.acc_k, r.acc_v)

    def finish() -> None:
        out_k[...] = (t.scale * r.acc_k[...]).astype(out_k.dtype)
        out_v[...] = r.acc_v[...].astype(out_v.dtype)

    grid_steps(lay, True, init, step, finish)


def query_major(
    lay: Layout,
    r: types.SimpleNamespace,
    statistics: str,
    accumulators: Sequence[Any],
    step: Callable[[jax.Array, jax.Array], None],
    finish: Callable[[], None],
) -> None:
    """A query-major kernel's body: each of the space-separated ``statistics`` rows (lse, c, ...)
    copied to its ``<name>_col`` scratch column and the ``accumulators`` zeroed at the first key
    block, then ``step`` on the visited key blocks and ``finish`` at the last."""

    def init() -> None:
        for name in statistics.split():
            getattr(r, f"{name}_col")[...] = row_to_col(getattr(r, name)[...])
        zero(*accumulators)

    grid_steps(lay, False, init, step, finish)


def columns(r: types.SimpleNamespace, statistics: str, width: int) -> list[jax.Array]:
    """The ``statistics``' scratch columns, each as wide as a score tile's ``width``."""
    return [lanes(getattr(r, f"{name}_col")[...], width) for name in statistics.split()]


def key_major_call(
    kernel: Callable[..., None],
    lay: Layout,
    kinds: str,
    depth: int,
    operands: Sequence[jax.Array],
    static: Static,
) -> Any:
    """(grad k, grad v) in k's and v's dtypes from a key-major kernel (see :func:`key_major`);
    ``operands`` start with q, k, v."""
    q, k, v = operands[:3]
    call = Call(kinds, "kd kv", key_scratch(lay), depth, key_major=True)
    out_kv = (out(k.shape, k.dtype, q), out(v.shape, v.dtype, q))
    return tiled_call(kernel, lay, call, operands, out_kv, static)
