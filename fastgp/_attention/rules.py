"""Attention as primitives whose derivatives close: the forward and four linear passes.

    attention_forward(q, k, v, mask)                     -> (o, lse)
    attention_tangent(P, mask, dq, dk, dv)               -> (do, dlse)        the JVP
    attention_vjp(P, mask, g_o, g_lse)                   -> (g_q, g_k, g_v)   its transpose
    attention_tangent_jvp(P, mask, dq, dk, dv, P_dot)    -> (do, dlse)'       along P_dot
    attention_vjp_jvp(P, mask, g_o, g_lse, P_dot)        -> (g_q, g_k, g_v)'  along P_dot
    attention_second_vjp(P, mask, dq, dk, dv, g_o, g_lse) -> grad_P <g, tangent(d)>

with P = (q, k, v, o, lse) the primal inputs (o, lse the forward's saved outputs) and P_dot a
direction of them. Shapes as in ``fastgp._attention.xla`` (``bhtd``, padded; ``mask`` the
(B, Tk) key mask).

The four linear passes are the partial derivatives of one trilinear form,
Psi(P; d, g, P_dot) = d/dP <g, tangent(P; d)> . P_dot, in the three slots it pairs: the tangent
slot d = (dq, dk, dv), the cotangent slot g = (g_o, g_lse) and the direction slot P_dot. A pass
takes one or two slots and returns the third's gradient (the tangent and the VJP are the
first-order case, <g, tangent(P; d)>). So the rules, each exact (derived in docs/kernels.md):

* JVP of the forward is the tangent at the saved (o, lse).
* A pass is linear in each slot it takes: its JVP along a slot is the pass on that slot's
  tangent. Its JVP along P is the pass that also takes the direction slot (tangent ->
  tangent_jvp, vjp -> vjp_jvp); for those that have it already (and second_vjp), it is JAX's JVP
  of the blockwise XLA pass, a loop over key blocks with rematerialised bodies, so every order
  keeps block memory.
* Its transpose in a slot is the pass that takes the other slot and the returned one: tangent
  and vjp transpose into each other, tangent_jvp into second_vjp (in P_dot) or vjp_jvp (in d),
  and so on around. So a penalty's VJP of a JVP and nested ``jax.grad`` both run second_vjp.

Each primitive runs the implementation that ``config.backend`` names: ``"xla"`` (the blockwise
loops) or a Pallas kernel (``fastgp._attention.binding``), on each device's shard
(``fastgp._attention.sharding``).
"""

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir
from jax.sharding import AxisType

from fastgp import _jax_private
from fastgp._attention import binding, ring, xla
from fastgp._attention.config import Config
from fastgp._attention.partitioned import partitioned
from fastgp._attention.sharding import bind_per_device

# Each backend's passes: the blockwise XLA loops, else the Pallas kernels.
Impl = binding.Impl


@functools.cache
def _one_device(name: str, config: Config) -> Impl:
    """Pass ``name`` on one device's arrays, one inlined ``jax.jit`` per (pass, config): equal
    calls (a critic's layers, a ring's steps) are traced once; unjitted where
    :func:`_jittable` says no."""
    if config.backend == "xla":
        fn = xla.PASSES[name]
        impl: Impl = lambda *args: fn(*args, config=config)
    else:
        impl = binding.kernel_pass(name, config)
    return jax.jit(impl, inline=True) if _jittable(config) else impl


@functools.cache
def _lowered(name: str, config: Config) -> Impl:
    """Pass ``name`` as lowered into a program: off a ring, one ``jax.jit`` per (pass, config),
    so that equal calls share one lowered body; on a ring, inline at every call, so that each
    call's collectives get channels of their own."""
    impl = _impl(name, config)
    return jax.jit(impl) if config.ring is None and _jittable(config) else impl


def _jittable(config: Config) -> bool:
    """Whether the backend's passes lower under ``jax.jit`` (TPU interpret mode does not)."""
    return config.backend != "tpu-interpret"


def _impl(name: str, config: Config) -> Impl:
    """Pass ``name`` on this device, or over the ring of devices when ``config.ring`` is set."""
    if config.ring is None:
        return _one_device(name, config)
    block = functools.partial(_one_device, name)
    if name == "forward":
        return lambda *args: ring.forward(block, config, *args)
    return lambda *args: ring.linear(
        block, config, args, _key_args(name), _key_results(name), _result_dtypes(name, args)
    )


def _new_primitive(name: str) -> Primitive:
    prim = Primitive(f"fastgp_attention_{name}")
    prim.multiple_results = True
    prim.def_impl(lambda *args, config: _impl(name, config)(*args))
    mlir.register_lowering(prim, functools.partial(_lowering, name), cacheable=False)
    # the partitioned lowering (_lowering) hands the devices to its callback
    try:
        _jax_private.resolve("prim_requires_devices_during_lowering").add(prim)
    except _jax_private.MissingPrivateJax:
        pass  # _lowering names it where an Auto-jit program needs the partitioning
    return prim


def _lowering(name: str, ctx: mlir.LoweringRuleContext, *args: Any, config: Config) -> Any:
    """Pass ``name`` lowered (uncached, see :func:`_lowered`): in an Auto-sharded program over
    several devices, the XLA backend's pass partitioned by fastgp (``partitioned``)."""
    if (
        config.backend == "xla"
        and config.ring is None
        and config.scheme != "all-gather"
        and _auto_over_devices(ctx)
    ):
        _jax_private.resolve("prim_requires_devices_during_lowering")
        fn = _partitioned(name, config, bool(jax.config.read("jax_enable_x64")))
    else:
        fn = _lowered(name, config)
    return mlir.lower_fun(lambda *a, config: fn(*a), multiple_results=True)(
        ctx, *args, config=config
    )


def _auto_over_devices(ctx: mlir.LoweringRuleContext) -> bool:
    """Whether this is an Auto-sharded program over several devices (not shard_map's body, not
    explicit axes) on a mesh whose axes name the splits, that can carry a partitioning callback:
    not one for ``jax.export``, and not one for a compile-only TPU client (from a CPU host),
    which has no custom partitioner."""
    context = ctx.module_context.axis_context
    if not isinstance(context, mlir.ShardingContext) or context.num_devices < 2:
        return False
    if ctx.module_context.lowering_parameters.for_export:
        return False
    mesh = context.abstract_mesh
    if mesh is None or mesh.empty or AxisType.Explicit in mesh.axis_types:
        return False
    devices = context.device_assignment or ()
    return not any(d.client.runtime_type == "compile_only_runtime" for d in devices[:1])


@functools.cache
def _partitioned(name: str, config: Config, x64: bool) -> Impl:
    key_results = frozenset() if name == "forward" else _key_results(name)
    key_args = ring.FORWARD_KEY_ARGS if name == "forward" else _key_args(name)
    return partitioned(functools.partial(_impl, name), config, key_args, key_results, x64)


forward_p = _new_primitive("forward")

# The slots a linear pass pairs, each a group of arrays: d shaped like (q, k, v), g like (o, lse),
# P_dot like (q, k, v, o, lse). A pass is named by the slots it takes, in this order.
SLOT_SIZES = {"d": 3, "g": 2, "p": 5}
_PASS_SLOTS = {
    "tangent": ("d",),
    "vjp": ("g",),
    "tangent_jvp": ("d", "p"),
    "vjp_jvp": ("g", "p"),
    "second_vjp": ("d", "g"),
}
LINEAR_PASSES = {name: _new_primitive(name) for name in _PASS_SLOTS}
_BY_SLOTS = {slots: name for name, slots in _PASS_SLOTS.items()}


def _returns(name: str) -> str:
    """The slot whose gradient a pass returns: d <-> g in first order, else the slot it lacks."""
    slots = _PASS_SLOTS[name]
    pool = "dg" if len(slots) == 1 else "dgp"
    (missing,) = (s for s in pool if s not in slots)
    return missing


def _pass_taking(slots: Sequence[str]) -> str:
    return _BY_SLOTS[tuple(sorted(slots))]


def _split(name: str, args: Sequence[Any]) -> tuple[Sequence[Any], Any, dict[str, list[Any]]]:
    """(primal inputs, key mask, {slot: its arrays}) of a linear pass's arguments."""
    groups, at = {}, 6
    for slot in _PASS_SLOTS[name]:
        groups[slot] = list(args[at : at + SLOT_SIZES[slot]])
        at += SLOT_SIZES[slot]
    assert at == len(args), (name, len(args))
    return args[:5], args[5], groups


def _key_args(name: str, extra: Sequence[str] = ()) -> frozenset[int]:
    """Positions of the key-side arguments of pass ``name`` (k, v, the key mask and the k and v
    parts of its slots, then of the ``extra`` slots appended): those that travel on a ring."""
    at, positions = 6, {1, 2, 5}
    for slot in (*_PASS_SLOTS[name], *extra):
        if slot != "g":
            positions |= {at + 1, at + 2}
        at += SLOT_SIZES[slot]
    return frozenset(positions)


def _key_results(name: str) -> frozenset[int]:
    """Positions of the key-side results of pass ``name``: the k and v parts of d or P."""
    return frozenset() if _returns(name) == "g" else frozenset({1, 2})


def _result_dtypes(name: str, args: Sequence[Any]) -> list[Any]:
    """The dtypes of pass ``name``'s results: q's for o, each array's own, float32 for lse."""
    q, k, v = (a.dtype for a in args[:3])
    return {"d": [q, k, v], "g": [q, jnp.float32], "p": [q, k, v, q, jnp.float32]}[_returns(name)]


def _bind(
    name: str, primal: Sequence[Any], mask: Any, groups: Mapping[str, Sequence[Any]], config: Config
) -> list[jax.Array]:
    linear = [x for slot in _PASS_SLOTS[name] for x in groups[slot]]
    return bind_per_device(LINEAR_PASSES[name], *primal, mask, *linear, config=config)


# --- Abstract evaluation ------------------------------------------------------------------------


def _like(aval: Any, shape: Sequence[int], dtype: Any) -> Any:
    """An aval of ``shape`` and ``dtype`` that keeps ``aval``'s sharding of the leading axes and
    its manual mesh axes (so shard_map's check_vma and explicit axes type the outputs)."""
    shape = tuple(shape)
    sharding = aval.sharding
    spec = tuple(sharding.spec)[: len(shape)] + (None,) * max(0, len(shape) - len(sharding.spec))
    return aval.update(shape=shape, dtype=dtype, sharding=sharding.update(spec=spec))


def _forward_abstract(q: Any, k: Any, v: Any, mask: Any, *, config: Config) -> list[Any]:
    return [_like(q, q.shape[:3] + v.shape[3:], q.dtype), _like(q, q.shape[:3], jnp.float32)]


def _slot_avals(slot: str, q: Any, k: Any, v: Any, o: Any, lse: Any) -> list[Any]:
    """Avals of a slot's arrays: (q, k, v) and o in their dtypes (o's in q's), lse float32."""
    o_like = _like(o, o.shape, q.dtype)
    lse_like = _like(lse, lse.shape, jnp.float32)
    qkv = [_like(x, x.shape, x.dtype) for x in (q, k, v)]
    return {"d": qkv, "g": [o_like, lse_like], "p": [*qkv, o_like, lse_like]}[slot]


forward_p.def_abstract_eval(_forward_abstract)
for _name, _prim in LINEAR_PASSES.items():
    _prim.def_abstract_eval(
        functools.partial(lambda name, *args, config: _slot_avals(_returns(name), *args[:5]), _name)
    )


# --- Derivative rules ---------------------------------------------------------------------------


def _all_zero(tangents: Sequence[Any]) -> bool:
    return all(type(t) is ad.Zero for t in tangents)


def _add(a: Sequence[jax.Array], b: Sequence[jax.Array]) -> list[jax.Array]:
    return [x + y.astype(x.dtype) for x, y in zip(a, b, strict=True)]


def _dense(tangents: Sequence[Any]) -> list[Any]:
    return [ad.instantiate_zeros(t) for t in tangents]


def _forward_jvp(primals: Sequence[jax.Array], tangents: Sequence[Any], *, config: Config):  # type: ignore[no-untyped-def]
    q, k, v, mask = primals
    o, lse = bind_per_device(forward_p, q, k, v, mask, config=config)
    d = {"d": _dense(tangents[:3])}
    return (o, lse), _bind("tangent", (q, k, v, o, lse), mask, d, config)


def _along_primal(
    name: str,
    primal: Sequence[Any],
    mask: Any,
    groups: dict[str, Any],
    dot: Sequence[Any],
    config: Config,
) -> list[jax.Array]:
    """The JVP of pass ``name`` along its primal inputs: the pass that also takes the direction
    slot, or (when it has that slot already, or takes d and g) JAX's JVP of the blockwise pass."""
    if len(_PASS_SLOTS[name]) == 1:
        return _bind(
            _pass_taking((*_PASS_SLOTS[name], "p")), primal, mask, {**groups, "p": dot}, config
        )
    fn = xla.PASSES[name]
    linear = [x for slot in _PASS_SLOTS[name] for x in groups[slot]]

    def jvp_of_pass(config: Config) -> Impl:
        def run(*args: jax.Array) -> tuple[jax.Array, ...]:
            p, lin, d = args[:5], args[6 : 6 + len(linear)], args[6 + len(linear) :]
            _, out = jax.jvp(lambda *p: fn(*p, args[5], *lin, config=config), tuple(p), tuple(d))
            return tuple(out)

        return run

    args = (*primal, mask, *linear, *dot)
    if config.ring is None:
        return list(jvp_of_pass(config)(*args))
    key_args = _key_args(name, extra=("p",))
    dtypes = _result_dtypes(name, args)
    return list(ring.linear(jvp_of_pass, config, args, key_args, _key_results(name), dtypes))


def _linear_pass_jvp(name: str) -> Callable[..., Any]:
    """JVP of a pass, linear in each slot it takes (see the module)."""

    def jvp(primals: Sequence[jax.Array], tangents: Sequence[Any], *, config: Config):  # type: ignore[no-untyped-def]
        primal, mask, groups = _split(name, primals)
        _, _, dots = _split(name, tangents)
        out = _bind(name, primal, mask, groups, config)
        terms = [
            _bind(name, primal, mask, {**groups, slot: _dense(dots[slot])}, config)
            for slot in _PASS_SLOTS[name]
            if not _all_zero(dots[slot])
        ]
        if not _all_zero(tangents[:5]):
            primal_dot = _dense(tangents[:5])
            terms.append(_along_primal(name, primal, mask, groups, primal_dot, config))
        if not terms:
            return out, [jnp.zeros_like(x) for x in out]
        return out, functools.reduce(_add, terms)

    return jvp


def _linear_pass_transpose(name: str) -> Callable[..., Any]:
    """Transpose of a pass in the one slot whose arrays are undefined: the pass that takes the
    other slot and the returned one, applied to the cotangents (see the module)."""

    def transpose(cotangents: Sequence[Any], *args: Any, config: Config) -> list[Any]:
        primal, mask, groups = _split(name, args)
        undefined = [s for s, xs in groups.items() if any(ad.is_undefined_primal(x) for x in xs)]
        if any(ad.is_undefined_primal(x) for x in (*primal, mask)) or len(undefined) != 1:
            raise NotImplementedError(
                f"fastgp.attention: the {name} pass is linear in each of its slots "
                f"{_PASS_SLOTS[name]} apart, not in its primal inputs or in two slots at once"
            )
        (slot,) = undefined
        others = {s: xs for s, xs in groups.items() if s != slot}
        others[_returns(name)] = _dense(cotangents)
        result = _bind(_pass_taking(list(others)), primal, mask, others, config)
        cts: list[Any] = [None] * 6
        for s in _PASS_SLOTS[name]:
            if s == slot:
                cts += [
                    r if ad.is_undefined_primal(x) else None
                    for r, x in zip(result, groups[s], strict=True)
                ]
            else:
                cts += [None] * SLOT_SIZES[s]
        return cts

    return transpose


ad.primitive_jvps[forward_p] = _forward_jvp
for _name, _prim in LINEAR_PASSES.items():
    ad.primitive_jvps[_prim] = _linear_pass_jvp(_name)
    ad.primitive_transposes[_prim] = _linear_pass_transpose(_name)


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


for _prim in (forward_p, *LINEAR_PASSES.values()):
    batching.primitive_batchers[_prim] = _batching_rule(_prim)


def attention_with_lse(
    q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, config: Config
) -> tuple[jax.Array, jax.Array]:
    """(o (B, H, Tq, Dv), lse (B, H, Tq) float32) of padded ``bhtd`` arrays; see the module."""
    o, lse = bind_per_device(forward_p, q, k, v, mask, config=config)
    return o, lse


__all__ = ["attention_with_lse"]
