"""Attention as three primitives whose derivatives close: forward, tangent (JVP) and VJP.

    attention_forward(q, k, v, mask)                       -> (o, lse)
    attention_tangent(q, k, v, o, lse, mask, dq, dk, dv)   -> (do, dlse)    linear in (dq, dk, dv)
    attention_vjp(q, k, v, o, lse, mask, g_o, g_lse)       -> (g_q, g_k, g_v) linear in (g_o, g_lse)

Shapes as in ``fastgp._attention.xla`` (``bhtd``, padded; ``mask`` the (B, Tk) key mask).

The rules, each exact (derived in docs/kernels.md):

* JVP of the forward is the tangent primitive at the saved (o, lse).
* The tangent and the VJP are each other's transposes, so reverse mode of either is the other:
  first-order reverse mode of attention runs the VJP kernel, and the VJP of the VJP (nested
  ``jax.grad``) runs the tangent kernel.
* The JVP of the tangent (and of the VJP) is that primitive again on the new linear tangents, plus
  the derivative through its primal inputs (q, k, v, o, lse), which is JAX's own JVP of the
  blockwise jnp pass: a loop over key blocks with rematerialised bodies, so every order keeps
  block memory.

Each primitive runs the implementation that ``config.backend`` names: ``"xla"`` (the blockwise
loops) or a Pallas kernel (``fastgp._attention.binding``), on each device's shard
(``fastgp._attention.sharding``).
"""

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from fastgp._attention import xla
from fastgp._attention.config import Config
from fastgp._attention.sharding import bind_per_device

Impl = Callable[..., tuple[jax.Array, ...]]
_KERNEL_IMPLS: dict[str, Callable[[str, Config], Impl]] = {}


def register_kernel_backend(backend: str, impls: Callable[[str, Config], Impl]) -> None:
    """Make ``impls(pass_name, config)`` the implementation of each pass for ``backend``."""
    _KERNEL_IMPLS[backend] = impls


def _impl(name: str, config: Config) -> Impl:
    if config.backend == "xla":
        fn = xla.PASSES[name]
        return lambda *args: fn(*args, config=config)
    return _KERNEL_IMPLS[config.backend](name, config)


def _new_primitive(name: str) -> Primitive:
    prim = Primitive(f"fastgp_attention_{name}")
    prim.multiple_results = True
    prim.def_impl(lambda *args, config: _impl(name, config)(*args))
    mlir.register_lowering(
        prim,
        mlir.lower_fun(lambda *args, config: _impl(name, config)(*args), multiple_results=True),
    )
    return prim


forward_p = _new_primitive("forward")
tangent_p = _new_primitive("tangent")
vjp_p = _new_primitive("vjp")


# --- Abstract evaluation ------------------------------------------------------------------------


def _like(aval: Any, shape: Sequence[int], dtype: Any) -> Any:
    """An aval of ``shape`` and ``dtype`` that keeps ``aval``'s sharding of the leading axes and
    its manual mesh axes (so shard_map's check_vma and explicit axes type the outputs)."""
    shape = tuple(shape)
    sharding = aval.sharding
    spec = tuple(sharding.spec)[: len(shape)] + (None,) * max(0, len(shape) - len(sharding.spec))
    return aval.update(shape=shape, dtype=dtype, sharding=sharding.update(spec=spec))


def _rows_aval(q: Any) -> Any:
    return _like(q, q.shape[:3], jnp.float32)


def _forward_abstract(q: Any, k: Any, v: Any, mask: Any, *, config: Config) -> list[Any]:
    return [_like(q, q.shape[:3] + v.shape[3:], q.dtype), _rows_aval(q)]


def _tangent_abstract(*args: Any, config: Config) -> list[Any]:
    q, _, _, o, lse = args[:5]
    return [_like(o, o.shape, q.dtype), _like(lse, lse.shape, jnp.float32)]


def _vjp_abstract(*args: Any, config: Config) -> list[Any]:
    q, k, v = args[:3]
    return [_like(x, x.shape, x.dtype) for x in (q, k, v)]


forward_p.def_abstract_eval(_forward_abstract)
tangent_p.def_abstract_eval(_tangent_abstract)
vjp_p.def_abstract_eval(_vjp_abstract)


# --- Derivative rules ---------------------------------------------------------------------------


def _all_zero(tangents: Sequence[Any]) -> bool:
    return all(type(t) is ad.Zero for t in tangents)


def _add(a: Sequence[jax.Array] | None, b: Sequence[jax.Array] | None) -> list[jax.Array]:
    if a is None:
        assert b is not None
        return list(b)
    if b is None:
        return list(a)
    return [x + y.astype(x.dtype) for x, y in zip(a, b, strict=True)]


def _forward_jvp(primals: Sequence[jax.Array], tangents: Sequence[Any], *, config: Config):  # type: ignore[no-untyped-def]
    q, k, v, mask = primals
    o, lse = bind_per_device(forward_p, q, k, v, mask, config=config)
    dq, dk, dv = (ad.instantiate_zeros(t) for t in tangents[:3])
    do, dlse = bind_per_device(tangent_p, q, k, v, o, lse, mask, dq, dk, dv, config=config)
    return (o, lse), (do, dlse)


def _linear_pass_jvp(prim: Primitive, name: str, n_linear: int) -> Callable[..., Any]:
    """JVP of a pass linear in its last ``n_linear`` arguments: the pass on their tangents plus
    JAX's JVP of the blockwise pass in its primal inputs (q, k, v, o, lse)."""

    def jvp(primals: Sequence[jax.Array], tangents: Sequence[Any], *, config: Config):  # type: ignore[no-untyped-def]
        primal_in, mask, linear = primals[:5], primals[5], primals[6:]
        primal_dot, linear_dot = tangents[:5], tangents[6:]
        assert len(linear) == n_linear
        out = bind_per_device(prim, *primal_in, mask, *linear, config=config)
        along_linear = None
        if not _all_zero(linear_dot):
            dense = [ad.instantiate_zeros(t) for t in linear_dot]
            along_linear = bind_per_device(prim, *primal_in, mask, *dense, config=config)
        along_primal = None
        if not _all_zero(primal_dot):
            fn = xla.PASSES[name]
            primal_dense = tuple(ad.instantiate_zeros(t) for t in primal_dot)
            _, along_primal = jax.jvp(
                lambda *p: fn(*p, mask, *linear, config=config), tuple(primal_in), primal_dense
            )
        if along_linear is None and along_primal is None:
            return out, [jnp.zeros_like(x) for x in out]
        return out, _add(along_linear, along_primal)

    return jvp


def _transpose_to(prim: Primitive) -> Callable[..., Any]:
    """Transpose of a pass in its linear arguments (those after the mask): ``prim``, the other
    pass, at the same primal inputs, applied to the cotangents."""

    def transpose(cotangents: Sequence[Any], *args: Any, config: Config) -> list[Any]:
        primal_in, mask, linear = args[:5], args[5], args[6:]
        if any(ad.is_undefined_primal(x) for x in (*primal_in, mask)):
            raise NotImplementedError(
                "fastgp.attention: a pass is linear only in its tangent or cotangent inputs"
            )
        cts = [ad.instantiate_zeros(x) for x in cotangents]
        result = bind_per_device(prim, *primal_in, mask, *cts, config=config)
        assert len(result) == len(linear)
        linear_cts = [
            r if ad.is_undefined_primal(x) else None for r, x in zip(result, linear, strict=True)
        ]
        return [None] * 6 + linear_cts

    return transpose


ad.primitive_jvps[forward_p] = _forward_jvp
ad.primitive_jvps[tangent_p] = _linear_pass_jvp(tangent_p, "tangent", 3)
ad.primitive_jvps[vjp_p] = _linear_pass_jvp(vjp_p, "vjp", 2)
ad.primitive_transposes[tangent_p] = _transpose_to(vjp_p)
ad.primitive_transposes[vjp_p] = _transpose_to(tangent_p)


# --- Batching (vmap) ----------------------------------------------------------------------------


def _batching_rule(prim: Primitive) -> Callable[..., Any]:
    """vmap: the mapped axis is folded into the batch axis B of every argument and unfolded from
    every result (the passes treat each (batch, head) independently)."""

    def rule(args: Sequence[jax.Array], dims: Sequence[Any], *, config: Config):  # type: ignore[no-untyped-def]
        size = next(a.shape[d] for a, d in zip(args, dims, strict=True) if d is not None)
        folded = []
        for a, d in zip(args, dims, strict=True):
            a = jnp.broadcast_to(a, (size, *a.shape)) if d is None else jnp.moveaxis(a, d, 0)
            folded.append(a.reshape((size * a.shape[1], *a.shape[2:])))
        outs = bind_per_device(prim, *folded, config=config)
        return [o.reshape((size, o.shape[0] // size, *o.shape[1:])) for o in outs], [0] * len(outs)

    return rule


for _prim in (forward_p, tangent_p, vjp_p):
    batching.primitive_batchers[_prim] = _batching_rule(_prim)


def attention_with_lse(
    q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, config: Config
) -> tuple[jax.Array, jax.Array]:
    """(o (B, H, Tq, Dv), lse (B, H, Tq) float32) of padded ``bhtd`` arrays; see the module."""
    o, lse = bind_per_device(forward_p, q, k, v, mask, config=config)
    return o, lse


__all__ = ["attention_with_lse", "register_kernel_backend"]
