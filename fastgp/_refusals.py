"""Refusals checked when a program is lowered: the one place fastgp fails at lowering time.

    refuse_when_lowered(x, message, when) -> x

A pass-through whose lowering raises ``ValueError(message)`` when ``when`` holds for the program
being lowered. Tracing is always fine, which is why these checks wait for lowering: the platform
and the device count are known only then, and ``lax.platform_dependent`` traces every branch but
lowers only those for the platforms being compiled.

    when                    raises when the program is lowered ...
    "always"                at all (a branch for a platform the backend cannot run on)
    "partitioned"           for several devices under Auto sharding
    "exported-partitioned"  for several devices by ``jax.export`` (custom_partitioning's Python
                            callbacks cannot be exported)
"""

from typing import Any, Literal, TypeAlias

import jax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

When: TypeAlias = Literal["always", "partitioned", "exported-partitioned"]

_refusal_p = Primitive("fastgp_refusal")
_refusal_p.def_abstract_eval(lambda x, *, message, when: x)
# Eagerly, as a jitted program on the array's own devices, so the lowering sees them too.
_refusal_p.def_impl(lambda x, **params: jax.jit(lambda y: _refusal_p.bind(y, **params))(x))
# Differentiable as the identity: the tangent needs no refusal of its own, the primal has one.
ad.primitive_jvps[_refusal_p] = lambda primals, tangents, **params: (
    _refusal_p.bind(primals[0], **params),
    tangents[0],
)
batching.primitive_batchers[_refusal_p] = lambda args, dims, **params: (
    _refusal_p.bind(*args, **params),
    dims[0],
)


def _holds(ctx: Any, when: When) -> bool:
    module = ctx.module_context
    if when == "always":
        return True
    several = getattr(module.axis_context, "num_devices", 1) > 1
    if when == "partitioned":
        return bool(several)
    return bool(several and module.lowering_parameters.for_export)


def _lower(ctx: Any, x: Any, *, message: str, when: When) -> list[Any]:
    if _holds(ctx, when):
        raise ValueError(message)
    return [x]


mlir.register_lowering(_refusal_p, _lower)


def refuse_when_lowered(x: jax.Array, message: str, when: When) -> jax.Array:
    """``x``, in a program whose lowering raises ``ValueError(message)`` when ``when`` holds."""
    return _refusal_p.bind(x, message=message, when=when)


__all__ = ["When", "refuse_when_lowered"]
