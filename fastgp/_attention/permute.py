"""The ring's hop: ``lax.ppermute`` with a channel of its own.

    permute(x, axis_name, perm) -> x sent from each device to its partner in ``perm``

Inside ``shard_map`` JAX lowers every ``ppermute`` with one channel id (1). XLA:CPU matches the
devices of a collective-permute by that id, so two permutes of one program in flight at once
(two rings with no data between them, as the passes of a second-order program are) join one
rendezvous and abort ("Id can't be larger than the number of participating threads"). This
primitive is ``ppermute`` in every respect (value, types, derivatives) but lowers with a fresh
channel id from the module, as XLA numbers its own collectives, at each occurrence (uncached; and
the attention primitives whose lowering holds it are uncached too, so that no two calls share a
lowered body and its channels). A body lowered into a module of its own (a custom partitioning's,
``fastgp._attention.partitioned``) numbers its channels from 1 again, so its permutes are traced
under :func:`own_channels`, which puts them above a base of their own.
"""

import contextlib
import contextvars
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import jax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir
from jax.lax import ppermute_p
from jaxlib.mlir.dialects import stablehlo as hlo

from fastgp import _jax_private

permute_p = Primitive("fastgp_ring_permute")
_CHANNEL_BASE = contextvars.ContextVar("fastgp_ring_channel_base", default=0)
_BASES = itertools.count(1)
Perm = tuple[tuple[int, int], ...]


@contextlib.contextmanager
def own_channels() -> Iterator[None]:
    """Permutes traced inside lower with channels above a base no other body uses."""
    token = _CHANNEL_BASE.set(next(_BASES) << 16)
    try:
        yield
    finally:
        _CHANNEL_BASE.reset(token)


def permute(x: jax.Array, axis_name: Any, perm: Sequence[tuple[int, int]]) -> jax.Array:
    """``lax.ppermute(x, axis_name, perm)`` with its own channel (see the module)."""
    axes = tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)
    x = _jax_private.resolve("insert_collective_pvary")(
        axes, x
    )  # varying over the ring, as ppermute
    pairs = tuple((src, dst) for src, dst in perm)
    return permute_p.bind(x, axis_name=axes, perm=pairs, channel_base=_CHANNEL_BASE.get())


def _abstract(x: Any, *, axis_name: Any, perm: Perm, channel_base: int) -> Any:
    return ppermute_p.abstract_eval(x, axis_name=axis_name, perm=perm)[0]


def _transpose(t: Any, x: Any, *, axis_name: Any, perm: Perm, channel_base: int) -> list[Any]:
    if type(t) is ad.Zero:
        return [ad.Zero(x.aval)]
    return [permute(t, axis_name, [(dst, src) for src, dst in perm])]


def _batch(args: Sequence[Any], dims: Sequence[Any], **params: Any) -> tuple[Any, Any]:
    return permute_p.bind(args[0], **params), dims[0]


def _lowering(
    ctx: mlir.LoweringRuleContext, x: Any, *, axis_name: Any, perm: Perm, channel_base: int
) -> Any:
    full_perm, _ = _jax_private.resolve("pcollectives_lowering_common")(
        ctx, axis_name=axis_name, perm=perm, op_name="ppermute"
    )
    channel_id = channel_base + ctx.module_context.new_channel()
    channel = hlo.ChannelHandle.get(channel_id, mlir.DEVICE_TO_DEVICE_TYPE)
    return hlo.CollectivePermuteOp(
        x, mlir.dense_int_elements(full_perm), channel_handle=channel
    ).results


permute_p.def_impl(lambda x, *, axis_name, perm, channel_base: jax.lax.ppermute(x, axis_name, perm))
permute_p.def_abstract_eval(_abstract)
ad.deflinear2(permute_p, _transpose)
batching.primitive_batchers[permute_p] = _batch
mlir.register_lowering(permute_p, _lowering, cacheable=False)


__all__ = ["own_channels", "permute"]
