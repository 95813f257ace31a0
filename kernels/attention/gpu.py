"""Pallas GPU (Triton) kernels for the attention passes of the TPU family.

    PASSES[name](*operands, **layout.Static)     (vmem_limit_bytes, a TPU limit, is ignored;
                                                 num_warps and num_stages set the launch)

``name`` and the operands are those of ``kernels.attention``'s TPU functions (``flash_<name>``,
same order, same results and dtypes); the tile algebra is theirs (``tiles``). Grids:
query-major (B, H, Tq / block_q), each program holding its block of queries and walking the key
blocks in a loop (causal: up to the last block it sees); key-major (B, H, Tk / block_k), each
holding a block of keys and walking the query blocks from the first that sees it. The walked
side is whole per (b, h) and sliced with ``pl.ds``; row statistics are (B, H, T) float32
vectors, the key mask (B, Tk) int32. Statistics and accumulators are float32.

The caller pads: block_q and block_k powers of two >= 16 dividing Tq and Tk (``gpu_blocks``),
D and Dv powers of two >= 16 (zero features change no score). Verified in Pallas interpret mode;
``jax.export(..., platforms=["cuda"])`` lowers them to Triton.

JAX deprecates its Pallas Triton backend (since 0.11) and will remove it: this module imports
``jax.experimental.pallas.triton``, so fastgp imports it only on first use of a Triton kernel
(``fastgp._gpu.pallas``); the tiles and the default launch are in ``gpu_tiling``.
"""

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any, Unpack

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from . import tiles
from .gpu_tiling import MAX_BLOCK, NUM_STAGES, NUM_WARPS, gpu_blocks
from .layout import Layout, Static, entry, layout_of, named
from .tiles import NEG, Tiles, accumulate

Arrays = tuple[jax.Array, ...]


# --- Specs, loops and masks -------------------------------------------------------------------


def _spec(lay: Layout, kind: str, key_major: bool) -> pl.BlockSpec:
    """Block spec of an operand of ``kind`` (as ``layout.spec``) on a GPU grid (b, h, block)."""
    queries = kind[0] == "q"
    whole = queries == key_major  # the side the program walks
    if kind == "km":
        size = lay.tk if whole else lay.bk
        return pl.BlockSpec((None, size), lambda b, h, n: (b, 0 if whole else n))
    length, block = (lay.tq, lay.bq) if queries else (lay.tk, lay.bk)
    size = length if whole else block
    if kind == "qs":
        return pl.BlockSpec((None, None, size), lambda b, h, n: (b, h, 0 if whole else n))
    width = lay.d if kind[1] == "d" else lay.dv
    return pl.BlockSpec((None, None, size, width), lambda b, h, n: (b, h, 0 if whole else n, 0))


def _block(ref: Any, index: jax.Array, size: int) -> jax.Array:
    """Block ``index`` of ``size`` rows of a walked operand."""
    return ref[pl.ds(index * size, size)]


def _valid(lay: Layout, km: jax.Array, i: jax.Array, j: jax.Array, key_major: bool) -> jax.Array:
    """Validity of the tile of query block i and key block j from the (bk,) key-mask block:
    (bq, bk), or (bk, bq) key-major."""
    shape = (lay.bk, lay.bq) if key_major else (lay.bq, lay.bk)
    keys_axis = 0 if key_major else 1
    keys = km[:, None] if key_major else km[None, :]
    valid = jnp.broadcast_to(keys != 0, shape)
    if lay.causal:
        key = j * lay.bk + lax.broadcasted_iota(jnp.int32, shape, keys_axis)
        query = lay.q_offset + i * lay.bq + lax.broadcasted_iota(jnp.int32, shape, 1 - keys_axis)
        valid = jnp.logical_and(valid, key <= query)
    return valid


def _walk(
    lay: Layout, n: jax.Array, key_major: bool, body: Callable[[jax.Array, Any], Any], init: Any
) -> Any:
    """Fold ``body(other_block, carry)`` over the blocks the program's block ``n`` meets."""
    if key_major:
        start = lay.first_q(n) if lay.causal else 0
        return lax.fori_loop(start, lay.nq, body, init)
    stop = lay.last_k(n) + 1 if lay.causal else lay.nk
    return lax.fori_loop(0, stop, body, init)


def _tile_probabilities(
    lay: Layout, t: Tiles, r: Any, q: jax.Array, k: jax.Array, i: jax.Array, j: jax.Array, lse: Any
) -> jax.Array:
    """P of the tile of query block i and key block j: (bq, bk) with key block j of the walked
    mask, or (bk, bq) key-major with the program's mask block."""
    km = r.km[...] if t.key_major else _block(r.km, j, lay.bk)
    return t.probabilities(q, k, _valid(lay, km, i, j, t.key_major), lse)


def _walk_queries(
    lay: Layout,
    t: Tiles,
    j: jax.Array,
    step: Callable[[jax.Array], tuple[jax.Array, jax.Array]],
    g_k: Any,
    g_v: Any,
) -> None:
    """Key-major: sum ``step(i)``'s (bk, D) and (bk, Dv) terms over the query blocks that see key
    block j, and write scale x the first to ``g_k``, the second to ``g_v``."""

    def body(i: jax.Array, carry: Any) -> Any:
        term_k, term_v = step(i)
        return carry[0] + term_k, carry[1] + term_v

    init = (jnp.zeros((lay.bk, lay.d), jnp.float32), jnp.zeros((lay.bk, lay.dv), jnp.float32))
    acc_k, acc_v = _walk(lay, j, True, body, init)
    g_k[...] = (t.scale * acc_k).astype(g_k.dtype)
    g_v[...] = acc_v.astype(g_v.dtype)


@dataclasses.dataclass(frozen=True)
class _Call:
    kernel: Callable[..., None]
    kinds: str
    out_kinds: str
    key_major: bool = False


def _run(
    call: _Call,
    lay: Layout,
    operands: Sequence[jax.Array],
    out_shapes: Sequence[tuple[tuple[int, ...], Any]],
    static: Static,
) -> Any:
    grid = (lay.batch, lay.heads, lay.nk if call.key_major else lay.nq)
    like = operands[0]
    return pl.pallas_call(
        functools.partial(call.kernel, lay=lay, t=Tiles(static["scale"], call.key_major)),
        out_shape=tuple(
            jax.ShapeDtypeStruct(s, d, manual_axis_type=jax.typeof(like).manual_axis_type)
            for s, d in out_shapes
        ),
        grid=grid,
        in_specs=[_spec(lay, kind, call.key_major) for kind in call.kinds.split()],
        out_specs=tuple(_spec(lay, kind, call.key_major) for kind in call.out_kinds.split()),
        compiler_params=plgpu.CompilerParams(
            num_warps=static.get("num_warps", NUM_WARPS),
            num_stages=static.get("num_stages", NUM_STAGES),
        ),
        interpret=static.get("interpret", False),
        name=f"fastgp_attention_{call.kernel.__name__.strip('_')}",
    )(*operands)


# --- Kernels ------------------------------------------------------------------------------------
# Query-major kernels read the program's query block whole and walk key blocks (j); key-major
# kernels the reverse (i). ``r`` names the refs; ``t`` is the tile algebra of the orientation.


def _forward(*refs: Any, lay: Layout, t: Tiles) -> None:
    r = named(refs, "q k v km o lse")
    i, q = pl.program_id(2), r.q[...]

    def body(j: jax.Array, carry: Any) -> Any:
        m, total, acc = carry
        valid = _valid(lay, _block(r.km, j, lay.bk), i, j, False)
        s = jnp.where(valid, t.scale * t.outer(q, _block(r.k, j, lay.bk)), NEG)
        m_next = jnp.maximum(m, jnp.max(s, axis=1))
        p = jnp.exp(jnp.where(valid, s - m_next[:, None], NEG))
        alpha = jnp.exp(m - m_next)
        acc = acc * alpha[:, None] + accumulate(p, _block(r.v, j, lay.bk))
        return m_next, alpha * total + jnp.sum(p, axis=1), acc

    rows = jnp.zeros((lay.bq,), jnp.float32)
    init = (rows + NEG, rows, jnp.zeros((lay.bq, lay.dv), jnp.float32))
    m, total, acc = _walk(lay, i, False, body, init)
    some = total > 0.0
    safe = jnp.where(some, total, 1.0)
    r.o[...] = (acc * jnp.where(some, 1.0 / safe, 0.0)[:, None]).astype(r.o.dtype)
    r.lse[...] = jnp.where(some, m + jnp.log(safe), 0.0)


def _tangent(*refs: Any, lay: Layout, t: Tiles) -> None:
    r = named(refs, "q k v o lse km dq dk dv do dlse")
    i, q, dq, lse = pl.program_id(2), r.q[...], r.dq[...], r.lse[...][:, None]

    def body(j: jax.Array, carry: Any) -> Any:
        mu, acc = carry
        k, dk = _block(r.k, j, lay.bk), _block(r.dk, j, lay.bk)
        p = _tile_probabilities(lay, t, r, q, k, i, j, lse)
        ps = p * t.along(q, k, dq, dk)
        acc = acc + accumulate(ps, _block(r.v, j, lay.bk)) + accumulate(p, _block(r.dv, j, lay.bk))
        return mu + jnp.sum(ps, axis=1), acc

    init = (jnp.zeros((lay.bq,), jnp.float32), jnp.zeros((lay.bq, lay.dv), jnp.float32))
    mu, acc = _walk(lay, i, False, body, init)
    r.do[...] = (acc - mu[:, None] * r.o[...].astype(jnp.float32)).astype(r.do.dtype)
    r.dlse[...] = mu


def _vjp_q(*refs: Any, lay: Layout, t: Tiles) -> None:
    r = named(refs, "q k v lse c km g_o g_q")
    i, q, g_o = pl.program_id(2), r.q[...], r.g_o[...]
    lse, c = r.lse[...][:, None], r.c[...][:, None]

    def body(j: jax.Array, acc: jax.Array) -> jax.Array:
        k = _block(r.k, j, lay.bk)
        p = _tile_probabilities(lay, t, r, q, k, i, j, lse)
        return acc + accumulate(t.ds(p, g_o, _block(r.v, j, lay.bk), c), k)

    acc = _walk(lay, i, False, body, jnp.zeros((lay.bq, lay.d), jnp.float32))
    r.g_q[...] = (t.scale * acc).astype(r.g_q.dtype)


def _vjp_kv(*refs: Any, lay: Layout, t: Tiles) -> None:
    r = named(refs, "q k v lse c km g_o g_k g_v")
    j, k, v = pl.program_id(2), r.k[...], r.v[...]

    def step(i: jax.Array) -> tuple[jax.Array, jax.Array]:
        q, g_o = _block(r.q, i, lay.bq), _block(r.g_o, i, lay.bq)
        lse, c = _block(r.lse, i, lay.bq)[None, :], _block(r.c, i, lay.bq)[None, :]
        p = _tile_probabilities(lay, t, r, q, k, i, j, lse)
        return accumulate(t.ds(p, g_o, v, c), q), accumulate(p, g_o)

    _walk_queries(lay, t, j, step, r.g_k, r.g_v)


def _tangent_jvp(*refs: Any, lay: Layout, t: Tiles) -> None:
    names = "q k v o lse km dq dk dv q_dot k_dot v_dot o_dot lse_dot do_dot dlse_dot"
    r = named(refs, names)
    i, q, dq, q_dot = pl.program_id(2), r.q[...], r.dq[...], r.q_dot[...]
    lse, lse_dot = r.lse[...][:, None], r.lse_dot[...][:, None]

    def body(j: jax.Array, carry: Any) -> Any:
        mu, mu_dot, acc = carry
        k, dk, k_dot = (_block(x, j, lay.bk) for x in (r.k, r.dk, r.k_dot))
        p = _tile_probabilities(lay, t, r, q, k, i, j, lse)
        ps, m, p_prime = tiles.tangent_jvp(t, p, q, k, dq, dk, q_dot, k_dot, lse_dot)
        v, dv, v_dot = (_block(x, j, lay.bk) for x in (r.v, r.dv, r.v_dot))
        acc = acc + accumulate(m, v) + accumulate(p_prime, dv) + accumulate(ps, v_dot)
        return mu + jnp.sum(ps, axis=1), mu_dot + jnp.sum(m, axis=1), acc

    rows = jnp.zeros((lay.bq,), jnp.float32)
    mu, mu_dot, acc = _walk(
        lay, i, False, body, (rows, rows, jnp.zeros((lay.bq, lay.dv), jnp.float32))
    )
    o, o_dot = r.o[...].astype(jnp.float32), r.o_dot[...].astype(jnp.float32)
    r.do_dot[...] = (acc - mu_dot[:, None] * o - mu[:, None] * o_dot).astype(r.do_dot.dtype)
    r.dlse_dot[...] = mu_dot


_VJP_JVP = "q k v k_dot v_dot q_dot g_o lse lse_dot c c_dot km"
_VJP_JVP_KINDS = "qd kd kv kd kv qd qv qs qs qs qs km"


def _vjp_jvp_q(*refs: Any, lay: Layout, t: Tiles) -> None:
    r = named(refs, _VJP_JVP + " g_q_dot")
    i, q, q_dot, g_o = pl.program_id(2), r.q[...], r.q_dot[...], r.g_o[...]
    lse, lse_dot, c, c_dot = (x[...][:, None] for x in (r.lse, r.lse_dot, r.c, r.c_dot))

    def body(j: jax.Array, acc: jax.Array) -> jax.Array:
        k, v, k_dot, v_dot = (_block(x, j, lay.bk) for x in (r.k, r.v, r.k_dot, r.v_dot))
        p = _tile_probabilities(lay, t, r, q, k, i, j, lse)
        ds, ds_prime, _ = tiles.vjp_jvp(t, p, q, k, v, q_dot, k_dot, v_dot, g_o, lse_dot, c, c_dot)
        return acc + accumulate(ds_prime, k) + accumulate(ds, k_dot)

    acc = _walk(lay, i, False, body, jnp.zeros((lay.bq, lay.d), jnp.float32))
    r.g_q_dot[...] = (t.scale * acc).astype(r.g_q_dot.dtype)


def _vjp_jvp_kv(*refs: Any, lay: Layout, t: Tiles) -> None:
    r = named(refs, _VJP_JVP + " g_k_dot g_v_dot")
    j, k, v, k_dot, v_dot = pl.program_id(2), r.k[...], r.v[...], r.k_dot[...], r.v_dot[...]

    def step(i: jax.Array) -> tuple[jax.Array, jax.Array]:
        q, q_dot, g_o = (_block(x, i, lay.bq) for x in (r.q, r.q_dot, r.g_o))
        lse, lse_dot, c, c_dot = (
            _block(x, i, lay.bq)[None, :] for x in (r.lse, r.lse_dot, r.c, r.c_dot)
        )
        p = _tile_probabilities(lay, t, r, q, k, i, j, lse)
        ds, ds_prime, p_prime = tiles.vjp_jvp(
            t, p, q, k, v, q_dot, k_dot, v_dot, g_o, lse_dot, c, c_dot
        )
        return accumulate(ds_prime, q) + accumulate(ds, q_dot), accumulate(p_prime, g_o)

    _walk_queries(lay, t, j, step, r.g_k_dot, r.g_v_dot)


_SECOND_VJP = "q k v dk dv dq g_o lse c km"
_SECOND_VJP_KINDS = "qd kd kv kd kv qd qv qs qs km"


def _second_vjp_q(*refs: Any, lay: Layout, t: Tiles) -> None:
    r = named(refs, _SECOND_VJP + " grad_q grad_o grad_lse")
    i, q, dq, g_o = pl.program_id(2), r.q[...], r.dq[...], r.g_o[...]
    lse, c = r.lse[...][:, None], r.c[...][:, None]

    def body(j: jax.Array, carry: Any) -> Any:
        mu, sum_a, acc = carry
        k, v, dk, dv = (_block(x, j, lay.bk) for x in (r.k, r.v, r.dk, r.dv))
        p = _tile_probabilities(lay, t, r, q, k, i, j, lse)
        ds, a, ps = tiles.second_vjp(t, p, q, k, v, dq, dk, dv, g_o, c)
        acc = acc + accumulate(a, k) + accumulate(ds, dk)
        return mu + jnp.sum(ps, axis=1), sum_a + jnp.sum(a, axis=1), acc

    rows = jnp.zeros((lay.bq,), jnp.float32)
    mu, sum_a, acc = _walk(
        lay, i, False, body, (rows, rows, jnp.zeros((lay.bq, lay.d), jnp.float32))
    )
    r.grad_q[...] = (t.scale * acc).astype(r.grad_q.dtype)
    r.grad_o[...] = (-mu[:, None] * g_o.astype(jnp.float32)).astype(r.grad_o.dtype)
    r.grad_lse[...] = -sum_a


def _second_vjp_kv(*refs: Any, lay: Layout, t: Tiles) -> None:
    r = named(refs, _SECOND_VJP + " grad_k grad_v")
    j, k, v, dk, dv = pl.program_id(2), r.k[...], r.v[...], r.dk[...], r.dv[...]

    def step(i: jax.Array) -> tuple[jax.Array, jax.Array]:
        q, dq, g_o = (_block(x, i, lay.bq) for x in (r.q, r.dq, r.g_o))
        lse, c = _block(r.lse, i, lay.bq)[None, :], _block(r.c, i, lay.bq)[None, :]
        p = _tile_probabilities(lay, t, r, q, k, i, j, lse)
        ds, a, ps = tiles.second_vjp(t, p, q, k, v, dq, dk, dv, g_o, c)
        return accumulate(a, q) + accumulate(ds, dq), accumulate(ps, g_o)

    _walk_queries(lay, t, j, step, r.grad_k, r.grad_v)


# --- Entry points ---------------------------------------------------------------------------


def _forward_pass(lay: Layout, static: Static, q: Any, k: Any, v: Any, km: Any) -> Arrays:
    b, h = lay.batch, lay.heads
    outs = (((b, h, lay.tq, lay.dv), q.dtype), ((b, h, lay.tq), jnp.float32))
    return tuple(_run(_Call(_forward, "qd kd kv km", "qv qs"), lay, (q, k, v, km), outs, static))


def _tangent_pass(lay: Layout, static: Static, *args: Any) -> Arrays:
    q, o, lse = args[0], args[3], args[4]
    outs = ((o.shape, q.dtype), (lse.shape, jnp.float32))
    call = _Call(_tangent, "qd kd kv qv qs km qd kd kv", "qv qs")
    return tuple(_run(call, lay, args, outs, static))


def _vjp_pass(lay: Layout, static: Static, *args: Any) -> Arrays:
    q, k, v, o, lse, km, g_o, g_lse = args
    operands = (q, k, v, lse, tiles.row_dots(g_o, o) - g_lse.astype(jnp.float32), km, g_o)
    kinds = "qd kd kv qs qs km qv"
    (g_q,) = _run(_Call(_vjp_q, kinds, "qd"), lay, operands, ((q.shape, q.dtype),), static)
    outs = ((k.shape, k.dtype), (v.shape, v.dtype))
    g_k, g_v = _run(_Call(_vjp_kv, kinds, "kd kv", True), lay, operands, outs, static)
    return g_q, g_k, g_v


def _tangent_jvp_pass(lay: Layout, static: Static, *args: Any) -> Arrays:
    q, o, lse = args[0], args[3], args[4]
    kinds = "qd kd kv qv qs km qd kd kv qd kd kv qv qs"
    outs = ((o.shape, q.dtype), (lse.shape, jnp.float32))
    return tuple(_run(_Call(_tangent_jvp, kinds, "qv qs"), lay, args, outs, static))


def _vjp_jvp_pass(lay: Layout, static: Static, *args: Any) -> Arrays:
    q, k, v, o, lse, km, g_o, g_lse, q_dot, k_dot, v_dot, o_dot, lse_dot = args
    c = tiles.row_dots(g_o, o) - g_lse.astype(jnp.float32)
    operands = (q, k, v, k_dot, v_dot, q_dot, g_o, lse, lse_dot, c, tiles.row_dots(g_o, o_dot), km)
    (g_q,) = _run(
        _Call(_vjp_jvp_q, _VJP_JVP_KINDS, "qd"), lay, operands, ((q.shape, q.dtype),), static
    )
    outs = ((k.shape, k.dtype), (v.shape, v.dtype))
    call = _Call(_vjp_jvp_kv, _VJP_JVP_KINDS, "kd kv", True)
    g_k, g_v = _run(call, lay, operands, outs, static)
    return g_q, g_k, g_v


def _second_vjp_pass(lay: Layout, static: Static, *args: Any) -> Arrays:
    q, k, v, o, lse, km, dq, dk, dv, g_o, g_lse = args
    c = tiles.row_dots(g_o, o) - g_lse.astype(jnp.float32)
    operands = (q, k, v, dk, dv, dq, g_o, lse, c, km)
    outs_q = ((q.shape, q.dtype), (o.shape, o.dtype), (lse.shape, jnp.float32))
    call = _Call(_second_vjp_q, _SECOND_VJP_KINDS, "qd qv qs")
    grad_q, grad_o, grad_lse = _run(call, lay, operands, outs_q, static)
    outs_kv = ((k.shape, k.dtype), (v.shape, v.dtype))
    call = _Call(_second_vjp_kv, _SECOND_VJP_KINDS, "kd kv", True)
    grad_k, grad_v = _run(call, lay, operands, outs_kv, static)
    return grad_q, grad_k, grad_v, grad_o, grad_lse


def _entry(name: str, run: Callable[..., Arrays], mask_at: int) -> Callable[..., Arrays]:
    def pass_(*args: jax.Array, **static: Unpack[Static]) -> Arrays:
        operands = list(args)
        operands[mask_at] = operands[mask_at].astype(jnp.int32)
        return run(layout_of(args, static), static, *operands)

    pass_.__name__ = pass_.__qualname__ = f"flash_{name}"
    pass_.__doc__ = f"The {name} pass on GPU: as ``kernels.attention.flash_{name}`` (module)."
    return entry(pass_)


PASSES: dict[str, Callable[..., Arrays]] = {
    "forward": _entry("forward", _forward_pass, 3),
    "tangent": _entry("tangent", _tangent_pass, 5),
    "vjp": _entry("vjp", _vjp_pass, 5),
    "tangent_jvp": _entry("tangent_jvp", _tangent_jvp_pass, 5),
    "vjp_jvp": _entry("vjp_jvp", _vjp_jvp_pass, 5),
    "second_vjp": _entry("second_vjp", _second_vjp_pass, 5),
}

__all__ = ["MAX_BLOCK", "NUM_STAGES", "NUM_WARPS", "PASSES", "gpu_blocks"]
