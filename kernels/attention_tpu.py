"""Pallas TPU kernels for attention whose every derivative is a kernel: forward, JVP and VJP.

Layout "bhtd": q (B, H, Tq, D), k (B, H, Tk, D), v (B, H, Tk, Dv); ``key_mask`` (B, Tk) int32,
1 = key valid. With valid_ij = key_mask[b, j] and (not causal or j <= i) (top-left aligned, as
``jax.nn.dot_product_attention``), S_ij = scale q_i.k_j and, for a row with a valid key,
L_i = log sum_{valid j} exp(S_ij), P_ij = valid_ij exp(S_ij - L_i); a row with no valid key has
L_i = 0, P_i. = 0 and O_i = 0 (no NaN, no inf).

    flash_forward(q, k, v, key_mask)                      -> o, lse
    flash_tangent(q, k, v, o, lse, key_mask, dq, dk, dv)  -> do, dlse      (the JVP)
    flash_vjp(q, k, v, o, lse, key_mask, g_o, g_lse)      -> g_q, g_k, g_v (its transpose)

The tangent, with P from the saved lse: Sdot_ij = scale (dq_i.k_j + q_i.dk_j),
mu_i = sum_j P_ij Sdot_ij, do_i = sum_j P_ij (Sdot_ij v_j + dv_j) - mu_i o_i, dlse_i = mu_i.
The VJP is its exact transpose (o is a saved value in both): delta_i = g_o_i.o_i,
dS_ij = P_ij (g_o_i.v_j - delta_i + g_lse_i), g_q = scale dS k, g_k = scale dS^T q, g_v = P^T g_o.
So transpose(vjp) = tangent: the pair closes under transposition.

Kernels are policy-free: the caller pads Tq and Tk to multiples of ``block_q`` and ``block_k``
(``attention_tiling.flash_blocks``) and marks padded keys invalid; padded rows of k and v must be
finite (zeros). Statistics and accumulators are float32 whatever the input dtype; matmuls run on
the MXU with float32 results, their operands in the inputs' dtype (P cast to v's dtype, as in
flash attention). Nothing Tq x Tk leaves VMEM.

Grids. Query-major kernels (forward, tangent, g_q): (B, H, Tq/bq, Tk/bk), the key blocks last
("arbitrary") with f32 VMEM scratch for the row statistics and the accumulator, written at the
last key block. Key-major kernel (g_k, g_v): (B, H, Tk/bk, Tq/bq), the query blocks last; it
computes the transposed score tile S^T (bk, bq) = k q^T, so the per-query statistics (lse,
delta - g_lse) broadcast along the sublanes straight from their lane-dense rows and every matmul
is an ordinary NN or NT one. Causal: a block strictly above the diagonal is skipped (``pl.when``)
and its index map repeats the last (query-major) or first (key-major) block that is used, so the
pipeline fetches nothing for it. Masks are ``broadcasted_iota`` comparisons and ``jnp.where``.

Row statistics in HBM are lane-dense rows: lse, dlse and delta - g_lse as (B, H, 1, Tq) blocks
(1, bq), the key mask as (B, 1, Tk) blocks (1, bk), which satisfy Mosaic's (8, 128) rule (the
second-minor block dim equals the array's 1). In VMEM the query-major kernels hold them as
(bq, 128) lane-broadcast columns, converted once per query block by a (128, bq) transpose.

Cost estimates (``pl.CostEstimate``), from the loop counts: with V = visited (query, key) block
pairs per (b, h) (nq * nk, or the blocks on or below the diagonal when causal) and
E = B * H * V * bq * bk the score elements computed,
    forward  flops 2 E (D + Dv),        transcendentals E + B H V bq (exp; rescale),
    tangent  flops 2 E (3 D + 2 Dv),    transcendentals E,
    g_q      flops 2 E (2 D + Dv),      transcendentals E,
    g_k, g_v flops 2 E (2 D + 2 Dv),    transcendentals E;
bytes: the operands read once per block of the grid's outer (resident) side, plus the streamed
side once per visited block pair (B H V block bytes), plus the outputs.
"""

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from .tiling import LANES

Ref = Any  # a Pallas reference to a block in VMEM
Interpret = bool | pltpu.InterpretParams  # Pallas interpret mode: off, generic, or TPU
NEG = -1e30  # a float32 "minus infinity": exp(NEG - x) == 0 for any moderate x, and no inf - inf
_NT = (((1,), (1,)), ((), ()))  # contract the last dims: a @ b.T
_NN = (((1,), (0,)), ((), ()))  # a @ b


def _nt(a: jax.Array, b: jax.Array) -> jax.Array:
    return lax.dot_general(a, b, _NT, preferred_element_type=jnp.float32)


def _nn(a: jax.Array, b: jax.Array) -> jax.Array:
    return lax.dot_general(a, b, _NN, preferred_element_type=jnp.float32)


def _lanes(x: jax.Array, n: int) -> jax.Array:
    """A (rows, 128) lane-broadcast column as (rows, n)."""
    if n == LANES:
        return x
    if n < LANES:
        return x[:, :n]
    reps = -(-n // LANES)
    tiled = jnp.tile(x, (1, reps))
    return tiled if n == reps * LANES else tiled[:, :n]


def _row_to_col(row: jax.Array) -> jax.Array:
    """A (1, n) lane-dense row as a (n, 128) lane-broadcast column."""
    return jnp.broadcast_to(row, (LANES, row.shape[1])).T


def _col_to_row(col: jax.Array) -> jax.Array:
    """A (n, 128) lane-broadcast column as a (1, n) lane-dense row."""
    return col.T[:1, :]


def _when(cond: jax.Array | bool, body: Callable[[], None]) -> None:
    if cond is True:
        body()
    else:
        pl.when(cond)(body)


@dataclasses.dataclass(frozen=True)
class _Layout:
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

    @property
    def nq(self) -> int:
        return self.tq // self.bq

    @property
    def nk(self) -> int:
        return self.tk // self.bk

    # lax.div, not //: jnp's floor division lowers through sign(), which Mosaic lowers only when
    # the compiling host is itself a TPU (operands here are non-negative, so they agree).
    def last_k(self, i: jax.Array) -> jax.Array:
        """The last key block that query block i sees (causal)."""
        return lax.div(i * self.bq + (self.bq - 1), self.bk)

    def first_q(self, j: jax.Array) -> jax.Array:
        """The first query block that sees key block j (causal)."""
        return lax.div(j * self.bk, self.bq)

    def visits(self, i: jax.Array, j: jax.Array) -> jax.Array | bool:
        """Whether block (query i, key j) holds a visible pair: j * bk <= i * bq + bq - 1."""
        return j * self.bk <= i * self.bq + (self.bq - 1) if self.causal else True

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
        return sum(min(self.nk, (i * self.bq + self.bq - 1) // self.bk + 1) for i in range(self.nq))

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
            row = i * self.bq + lax.broadcasted_iota(jnp.int32, shape, 0)
            col = j * self.bk + lax.broadcasted_iota(jnp.int32, shape, 1)
            valid = jnp.logical_and(valid, col <= row)
        return valid

    def valid_t(self, key_col: jax.Array, j: jax.Array, i: jax.Array) -> jax.Array:
        """(bk, bq) validity of a transposed tile from the (bk, 128) float32 key-mask column."""
        shape = (self.bk, self.bq)
        valid = _lanes(key_col, self.bq) > 0.5
        if self.causal:
            key = j * self.bk + lax.broadcasted_iota(jnp.int32, shape, 0)
            query = i * self.bq + lax.broadcasted_iota(jnp.int32, shape, 1)
            valid = jnp.logical_and(valid, key <= query)
        return valid


def _layout(
    q: jax.Array, k: jax.Array, v: jax.Array, block_q: int, block_k: int, causal: bool
) -> _Layout:
    batch, heads, tq, d = q.shape
    tk, dv = k.shape[2], v.shape[3]
    return _Layout(batch, heads, tq, tk, d, dv, min(block_q, tq), min(block_k, tk), causal)


def _nbytes(*arrays: jax.Array) -> int:
    return sum(a.size * a.dtype.itemsize for a in arrays)


def _compiler_params(vmem_limit_bytes: int | None) -> pltpu.CompilerParams:
    return pltpu.CompilerParams(
        dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"),
        vmem_limit_bytes=vmem_limit_bytes,
    )


def _out(shape: tuple[int, ...], dtype: Any, like: jax.Array) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype, manual_axis_type=jax.typeof(like).manual_axis_type)


# --- Block specs ----------------------------------------------------------------------------
# Query-major grid (b, h, i, j); key-major grid (b, h, j, i).


def _q_rows(lay: _Layout, width: int) -> pl.BlockSpec:  # (B, H, Tq, width), query-major
    return pl.BlockSpec((None, None, lay.bq, width), lambda b, h, i, j: (b, h, i, 0))


def _q_stat(lay: _Layout) -> pl.BlockSpec:  # (B, H, 1, Tq), query-major
    return pl.BlockSpec((None, None, 1, lay.bq), lambda b, h, i, j: (b, h, 0, i))


def _k_rows_streamed(lay: _Layout, width: int) -> pl.BlockSpec:  # (B, H, Tk, width)
    return pl.BlockSpec(
        (None, None, lay.bk, width), lambda b, h, i, j: (b, h, lay.k_index(i, j), 0)
    )


def _k_mask_streamed(lay: _Layout) -> pl.BlockSpec:  # (B, 1, Tk)
    return pl.BlockSpec((None, 1, lay.bk), lambda b, h, i, j: (b, 0, lay.k_index(i, j)))


def _k_rows(lay: _Layout, width: int) -> pl.BlockSpec:  # (B, H, Tk, width), key-major
    return pl.BlockSpec((None, None, lay.bk, width), lambda b, h, j, i: (b, h, j, 0))


def _k_mask(lay: _Layout) -> pl.BlockSpec:  # (B, 1, Tk), key-major
    return pl.BlockSpec((None, 1, lay.bk), lambda b, h, j, i: (b, 0, j))


def _q_rows_streamed(lay: _Layout, width: int) -> pl.BlockSpec:  # (B, H, Tq, width), key-major
    return pl.BlockSpec(
        (None, None, lay.bq, width), lambda b, h, j, i: (b, h, lay.q_index(j, i), 0)
    )


def _q_stat_streamed(lay: _Layout) -> pl.BlockSpec:  # (B, H, 1, Tq), key-major
    return pl.BlockSpec((None, None, 1, lay.bq), lambda b, h, j, i: (b, h, 0, lay.q_index(j, i)))


# --- Kernels --------------------------------------------------------------------------------


def _forward_kernel(
    q_ref: Ref,
    k_ref: Ref,
    v_ref: Ref,
    km_ref: Ref,
    o_ref: Ref,
    lse_ref: Ref,
    m_ref: Ref,
    l_ref: Ref,
    acc_ref: Ref,
    *,
    lay: _Layout,
    scale: float,
) -> None:
    i, j = pl.program_id(2), pl.program_id(3)

    @pl.when(j == 0)
    def _init() -> None:
        m_ref[...] = jnp.full(m_ref.shape, NEG, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    def _step() -> None:
        v = v_ref[...]
        s = scale * _nt(q_ref[...], k_ref[...])
        valid = lay.valid(km_ref[...], i, j)
        m_prev = m_ref[...]
        m_next = jnp.maximum(m_prev, jnp.max(jnp.where(valid, s, NEG), axis=1, keepdims=True))
        p = jnp.exp(jnp.where(valid, s - _lanes(m_next, lay.bk), NEG))
        alpha = jnp.exp(m_prev - m_next)
        l_ref[...] = alpha * l_ref[...] + jnp.sum(p, axis=1, keepdims=True)
        m_ref[...] = m_next
        acc_ref[...] = acc_ref[...] * _lanes(alpha, lay.dv) + _nn(p.astype(v.dtype), v)

    _when(lay.visits(i, j), _step)

    @pl.when(j == lay.nk - 1)
    def _finish() -> None:
        total = l_ref[...]
        some = total > 0.0
        safe = jnp.where(some, total, 1.0)
        inv = jnp.where(some, 1.0 / safe, 0.0)
        o_ref[...] = (acc_ref[...] * _lanes(inv, lay.dv)).astype(o_ref.dtype)
        lse_ref[...] = _col_to_row(jnp.where(some, m_ref[...] + jnp.log(safe), 0.0))


def _tangent_kernel(
    q_ref: Ref,
    k_ref: Ref,
    v_ref: Ref,
    o_ref: Ref,
    lse_ref: Ref,
    km_ref: Ref,
    dq_ref: Ref,
    dk_ref: Ref,
    dv_ref: Ref,
    do_ref: Ref,
    dlse_ref: Ref,
    lse_col_ref: Ref,
    mu_ref: Ref,
    acc_ref: Ref,
    *,
    lay: _Layout,
    scale: float,
) -> None:
    i, j = pl.program_id(2), pl.program_id(3)

    @pl.when(j == 0)
    def _init() -> None:
        lse_col_ref[...] = _row_to_col(lse_ref[...])
        mu_ref[...] = jnp.zeros(mu_ref.shape, jnp.float32)
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    def _step() -> None:
        q, k, v, dv = q_ref[...], k_ref[...], v_ref[...], dv_ref[...]
        s = scale * _nt(q, k)
        valid = lay.valid(km_ref[...], i, j)
        p = jnp.exp(jnp.where(valid, s - _lanes(lse_col_ref[...], lay.bk), NEG))
        s_dot = scale * (_nt(dq_ref[...], k) + _nt(q, dk_ref[...]))
        ps = p * s_dot
        mu_ref[...] += jnp.sum(ps, axis=1, keepdims=True)
        acc_ref[...] += _nn(ps.astype(v.dtype), v) + _nn(p.astype(dv.dtype), dv)

    _when(lay.visits(i, j), _step)

    @pl.when(j == lay.nk - 1)
    def _finish() -> None:
        mu = mu_ref[...]
        o = o_ref[...].astype(jnp.float32)
        do_ref[...] = (acc_ref[...] - _lanes(mu, lay.dv) * o).astype(do_ref.dtype)
        dlse_ref[...] = _col_to_row(mu)


def _dq_kernel(
    q_ref: Ref,
    k_ref: Ref,
    v_ref: Ref,
    lse_ref: Ref,
    c_ref: Ref,
    km_ref: Ref,
    go_ref: Ref,
    gq_ref: Ref,
    lse_col_ref: Ref,
    c_col_ref: Ref,
    acc_ref: Ref,
    *,
    lay: _Layout,
    scale: float,
) -> None:
    i, j = pl.program_id(2), pl.program_id(3)

    @pl.when(j == 0)
    def _init() -> None:
        lse_col_ref[...] = _row_to_col(lse_ref[...])
        c_col_ref[...] = _row_to_col(c_ref[...])
        acc_ref[...] = jnp.zeros(acc_ref.shape, jnp.float32)

    def _step() -> None:
        k = k_ref[...]
        s = scale * _nt(q_ref[...], k)
        valid = lay.valid(km_ref[...], i, j)
        p = jnp.exp(jnp.where(valid, s - _lanes(lse_col_ref[...], lay.bk), NEG))
        dp = _nt(go_ref[...], v_ref[...])
        ds = p * (dp - _lanes(c_col_ref[...], lay.bk))
        acc_ref[...] += _nn(ds.astype(k.dtype), k)

    _when(lay.visits(i, j), _step)

    @pl.when(j == lay.nk - 1)
    def _finish() -> None:
        gq_ref[...] = (scale * acc_ref[...]).astype(gq_ref.dtype)


def _dkv_kernel(
    q_ref: Ref,
    k_ref: Ref,
    v_ref: Ref,
    lse_ref: Ref,
    c_ref: Ref,
    km_ref: Ref,
    go_ref: Ref,
    gk_ref: Ref,
    gv_ref: Ref,
    key_col_ref: Ref,
    acc_k_ref: Ref,
    acc_v_ref: Ref,
    *,
    lay: _Layout,
    scale: float,
) -> None:
    j, i = pl.program_id(2), pl.program_id(3)

    @pl.when(i == 0)
    def _init() -> None:
        key_col_ref[...] = _row_to_col((km_ref[...] != 0).astype(jnp.float32))
        acc_k_ref[...] = jnp.zeros(acc_k_ref.shape, jnp.float32)
        acc_v_ref[...] = jnp.zeros(acc_v_ref.shape, jnp.float32)

    def _step() -> None:
        q, go = q_ref[...], go_ref[...]
        s_t = scale * _nt(k_ref[...], q)  # (bk, bq)
        valid = lay.valid_t(key_col_ref[...], j, i)
        p_t = jnp.exp(jnp.where(valid, s_t - lse_ref[...], NEG))
        acc_v_ref[...] += _nn(p_t.astype(go.dtype), go)
        dp_t = _nt(v_ref[...], go)
        ds_t = p_t * (dp_t - c_ref[...])
        acc_k_ref[...] += _nn(ds_t.astype(q.dtype), q)

    _when(lay.visits(i, j), _step)

    @pl.when(i == lay.nq - 1)
    def _finish() -> None:
        gk_ref[...] = (scale * acc_k_ref[...]).astype(gk_ref.dtype)
        gv_ref[...] = acc_v_ref[...].astype(gv_ref.dtype)


# --- Entry points ---------------------------------------------------------------------------

_STATIC = ("scale", "causal", "block_q", "block_k", "interpret", "vmem_limit_bytes")


def _stat_rows(x: jax.Array) -> jax.Array:
    """(B, H, T) -> (B, H, 1, T) float32, the lane-dense layout the kernels read."""
    return x.astype(jnp.float32).reshape(x.shape[0], x.shape[1], 1, x.shape[2])


def _key_rows(key_mask: jax.Array) -> jax.Array:
    return key_mask.astype(jnp.int32).reshape(key_mask.shape[0], 1, key_mask.shape[1])


@functools.partial(jax.jit, static_argnames=_STATIC)
def flash_forward(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    key_mask: jax.Array,
    *,
    scale: float,
    causal: bool,
    block_q: int,
    block_k: int,
    interpret: Interpret = False,
    vmem_limit_bytes: int | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Attention forward with its log-sum-exp: online softmax over key blocks.

    Args:
      q, k, v: (B, H, Tq, D), (B, H, Tk, D), (B, H, Tk, Dv); f32, bf16 or f16.
      key_mask: (B, Tk) int32, 1 = valid key.
      scale: multiplies q.k. causal: query i sees key j only if j <= i.
      block_q, block_k: must divide Tq and Tk (``flash_blocks``).
      interpret: Pallas interpret mode (True or ``pltpu.InterpretParams``).
      vmem_limit_bytes: scoped-VMEM limit (``flash_blocks(...).vmem_limit_bytes``; None: default).

    Returns:
      o (B, H, Tq, Dv) in q.dtype and lse (B, H, Tq) float32 (0 and 0 for rows with no valid key).
    """
    lay = _layout(q, k, v, block_q, block_k, causal)
    b, h = lay.batch, lay.heads
    e = lay.elements()
    o, lse = pl.pallas_call(
        functools.partial(_forward_kernel, lay=lay, scale=scale),
        out_shape=(
            _out((b, h, lay.tq, lay.dv), q.dtype, q),
            _out((b, h, 1, lay.tq), jnp.float32, q),
        ),
        grid=(b, h, lay.nq, lay.nk),
        in_specs=[
            _q_rows(lay, lay.d),
            _k_rows_streamed(lay, lay.d),
            _k_rows_streamed(lay, lay.dv),
            _k_mask_streamed(lay),
        ],
        out_specs=(_q_rows(lay, lay.dv), _q_stat(lay)),
        scratch_shapes=[
            pltpu.VMEM((lay.bq, LANES), jnp.float32),
            pltpu.VMEM((lay.bq, LANES), jnp.float32),
            pltpu.VMEM((lay.bq, lay.dv), jnp.float32),
        ],
        compiler_params=_compiler_params(vmem_limit_bytes),
        cost_estimate=pl.CostEstimate(
            flops=2 * e * (lay.d + lay.dv),
            transcendentals=e + lay.streamed() * lay.bq,
            bytes_accessed=_nbytes(q)
            + lay.streamed() * lay.bk * (lay.d * k.dtype.itemsize + lay.dv * v.dtype.itemsize + 4)
            + b * h * lay.tq * (lay.dv * q.dtype.itemsize + 4),
        ),
        interpret=interpret,
    )(q, k, v, _key_rows(key_mask))
    return o, lse.reshape(b, h, lay.tq)


@functools.partial(jax.jit, static_argnames=_STATIC)
def flash_tangent(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    o: jax.Array,
    lse: jax.Array,
    key_mask: jax.Array,
    dq: jax.Array,
    dk: jax.Array,
    dv: jax.Array,
    *,
    scale: float,
    causal: bool,
    block_q: int,
    block_k: int,
    interpret: Interpret = False,
    vmem_limit_bytes: int | None = None,
) -> tuple[jax.Array, jax.Array]:
    """The JVP of ``flash_forward`` at (q, k, v) with its saved o, lse, along (dq, dk, dv).

    Returns:
      do (B, H, Tq, Dv) in q.dtype and dlse (B, H, Tq) float32. Arguments as ``flash_forward``;
      o, lse are its outputs, dq, dk, dv tangents shaped like q, k, v.
    """
    lay = _layout(q, k, v, block_q, block_k, causal)
    b, h = lay.batch, lay.heads
    e = lay.elements()
    kv_bytes = (lay.d * (k.dtype.itemsize + dk.dtype.itemsize)) + lay.dv * (
        v.dtype.itemsize + dv.dtype.itemsize
    )
    do, dlse = pl.pallas_call(
        functools.partial(_tangent_kernel, lay=lay, scale=scale),
        out_shape=(
            _out((b, h, lay.tq, lay.dv), q.dtype, q),
            _out((b, h, 1, lay.tq), jnp.float32, q),
        ),
        grid=(b, h, lay.nq, lay.nk),
        in_specs=[
            _q_rows(lay, lay.d),
            _k_rows_streamed(lay, lay.d),
            _k_rows_streamed(lay, lay.dv),
            _q_rows(lay, lay.dv),
            _q_stat(lay),
            _k_mask_streamed(lay),
            _q_rows(lay, lay.d),
            _k_rows_streamed(lay, lay.d),
            _k_rows_streamed(lay, lay.dv),
        ],
        out_specs=(_q_rows(lay, lay.dv), _q_stat(lay)),
        scratch_shapes=[
            pltpu.VMEM((lay.bq, LANES), jnp.float32),
            pltpu.VMEM((lay.bq, LANES), jnp.float32),
            pltpu.VMEM((lay.bq, lay.dv), jnp.float32),
        ],
        compiler_params=_compiler_params(vmem_limit_bytes),
        cost_estimate=pl.CostEstimate(
            flops=2 * e * (3 * lay.d + 2 * lay.dv),
            transcendentals=e,
            bytes_accessed=_nbytes(q, o, dq)
            + lay.streamed() * lay.bk * (kv_bytes + 4)
            + b * h * lay.tq * (lay.dv * q.dtype.itemsize + 8),
        ),
        interpret=interpret,
    )(q, k, v, o, _stat_rows(lse), _key_rows(key_mask), dq, dk, dv)
    return do, dlse.reshape(b, h, lay.tq)


@functools.partial(jax.jit, static_argnames=_STATIC)
def flash_vjp(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    o: jax.Array,
    lse: jax.Array,
    key_mask: jax.Array,
    g_o: jax.Array,
    g_lse: jax.Array,
    *,
    scale: float,
    causal: bool,
    block_q: int,
    block_k: int,
    interpret: Interpret = False,
    vmem_limit_bytes: int | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The VJP of ``flash_forward`` (the transpose of ``flash_tangent``) for cotangents g_o, g_lse.

    Two kernels: g_q over query blocks (key blocks last), g_k and g_v over key blocks (query
    blocks last). delta_i = g_o_i.o_i is computed here in float32 from the saved o and passed
    as the row statistic delta - g_lse.

    Returns:
      g_q, g_k, g_v in the dtypes of q, k, v. Arguments as ``flash_tangent``; g_o (B, H, Tq, Dv),
      g_lse (B, H, Tq).
    """
    lay = _layout(q, k, v, block_q, block_k, causal)
    b, h = lay.batch, lay.heads
    e = lay.elements()
    delta = jnp.sum(g_o.astype(jnp.float32) * o.astype(jnp.float32), axis=-1)
    c = _stat_rows(delta - g_lse.astype(jnp.float32))
    lse_rows, key_rows = _stat_rows(lse), _key_rows(key_mask)
    q_item, go_item = q.dtype.itemsize, g_o.dtype.itemsize
    kv_item = lay.d * k.dtype.itemsize + lay.dv * v.dtype.itemsize

    g_q = pl.pallas_call(
        functools.partial(_dq_kernel, lay=lay, scale=scale),
        out_shape=_out(q.shape, q.dtype, q),
        grid=(b, h, lay.nq, lay.nk),
        in_specs=[
            _q_rows(lay, lay.d),
            _k_rows_streamed(lay, lay.d),
            _k_rows_streamed(lay, lay.dv),
            _q_stat(lay),
            _q_stat(lay),
            _k_mask_streamed(lay),
            _q_rows(lay, lay.dv),
        ],
        out_specs=_q_rows(lay, lay.d),
        scratch_shapes=[
            pltpu.VMEM((lay.bq, LANES), jnp.float32),
            pltpu.VMEM((lay.bq, LANES), jnp.float32),
            pltpu.VMEM((lay.bq, lay.d), jnp.float32),
        ],
        compiler_params=_compiler_params(vmem_limit_bytes),
        cost_estimate=pl.CostEstimate(
            flops=2 * e * (2 * lay.d + lay.dv),
            transcendentals=e,
            bytes_accessed=2 * _nbytes(q)
            + _nbytes(g_o)
            + b * h * lay.tq * 8
            + lay.streamed() * lay.bk * (kv_item + 4),
        ),
        interpret=interpret,
    )(q, k, v, lse_rows, c, key_rows, g_o)

    g_k, g_v = pl.pallas_call(
        functools.partial(_dkv_kernel, lay=lay, scale=scale),
        out_shape=(_out(k.shape, k.dtype, q), _out(v.shape, v.dtype, q)),
        grid=(b, h, lay.nk, lay.nq),
        in_specs=[
            _q_rows_streamed(lay, lay.d),
            _k_rows(lay, lay.d),
            _k_rows(lay, lay.dv),
            _q_stat_streamed(lay),
            _q_stat_streamed(lay),
            _k_mask(lay),
            _q_rows_streamed(lay, lay.dv),
        ],
        out_specs=(_k_rows(lay, lay.d), _k_rows(lay, lay.dv)),
        scratch_shapes=[
            pltpu.VMEM((lay.bk, LANES), jnp.float32),
            pltpu.VMEM((lay.bk, lay.d), jnp.float32),
            pltpu.VMEM((lay.bk, lay.dv), jnp.float32),
        ],
        compiler_params=_compiler_params(vmem_limit_bytes),
        cost_estimate=pl.CostEstimate(
            flops=2 * e * (2 * lay.d + 2 * lay.dv),
            transcendentals=e,
            bytes_accessed=2 * _nbytes(k, v)
            + b * lay.tk * 4
            + lay.streamed() * lay.bq * (lay.d * q_item + lay.dv * go_item + 8),
        ),
        interpret=interpret,
    )(q, k, v, lse_rows, c, key_rows, g_o)
    return g_q, g_k, g_v
