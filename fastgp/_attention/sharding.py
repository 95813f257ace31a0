"""Where an attention kernel runs under each sharding mode: each device on its batch and heads.

    bind_per_device(prim, *args, config) -> the primitive's results

Arguments are the ``bhtd`` arrays of ``fastgp._attention.rules`` and the (B, Tk) key mask. A
per-(batch, head) op partitions trivially over B and H; the sequence and feature axes must be
whole on each device. The XLA backend is bound as it is (in an Auto-sharded program its lowering
partitions each pass, ``fastgp._attention.partitioned``). For the kernels:

* inside ``shard_map`` (every mesh axis Manual): the kernel runs on the shard as it is;
* explicit axes: a ``shard_map`` over the arrays' mesh, batch and head axes as they are sharded;
* Auto-sharded ``jax.jit`` over several devices: refused when lowered, with an error naming the
  ways out (custom_partitioning cannot carry a Mosaic call, as for the norm kernels).

``"pallas"`` lowered for any platform but TPU and GPU is refused by the binding
(``fastgp._attention.binding``).
"""

from collections.abc import Sequence
from typing import Any

import jax
from jax.extend.core import Primitive
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from fastgp._backends import INTERPRET_BACKENDS
from fastgp._refusals import refuse_when_lowered
from fastgp._sharding import mesh_of, mode_of, spec_of
from fastgp.distributed import varying_axes

_AUTO_MESSAGE = (
    "fastgp.attention(backend={backend!r}) cannot run its kernels on this Auto-sharded program "
    "over several devices: custom_partitioning cannot carry a Pallas kernel call, so each "
    "device would get the whole batch. Run the step under explicit sharding (jax.make_mesh with "
    "AxisType.Explicit axes, jax.set_mesh) or inside shard_map, where each device runs its own "
    "batch and heads, or use backend='xla' (the blockwise loops, which fastgp partitions here: "
    "split tokens go around a ring of the devices)."
)


def _specs(args: Sequence[jax.Array], backend: str) -> tuple[Any, Any, list[P]]:
    """(batch axes, head axes, in_specs), refusing a sharded sequence or feature axis."""
    q_spec = spec_of(args[0])
    batch, heads = q_spec[0], q_spec[1]
    specs = []
    for i, x in enumerate(args):
        spec = spec_of(x)
        if x.ndim == 2:  # the key mask (B, Tk)
            whole = spec[1:]
            specs.append(P(batch, None))
        else:
            whole = spec[2:]
            specs.append(P(batch, heads, *([None] * (x.ndim - 2))))
        if any(axis is not None for axis in whole):
            raise ValueError(
                f"fastgp.attention(backend={backend!r}) runs each device's batch and heads, but "
                f"operand {i} of shape {tuple(x.shape)} (batch, heads, tokens, features; the "
                f"key mask: batch, tokens) is sharded as {spec}: its token and feature axes must "
                "be whole on each device. Reshard it, or use backend='xla'."
            )
    return batch, heads, specs


def kernels_run_per_device(q: jax.Array, k: jax.Array, v: jax.Array) -> bool:
    """Whether the kernels can run on each device's part of these (B, T, H, D) operands: inside
    shard_map; under explicit axes when the token and feature axes are whole; in an Auto-sharded
    program only on one device (over several, only XLA's partitioner can split the work)."""
    try:
        mode = mode_of(q, "fastgp.attention")
    except ValueError:  # a mixed mesh: only XLA runs there
        return False
    if mode == "auto":
        return jax.device_count() == 1
    if mode == "explicit":
        return all(spec_of(x)[1] is None and spec_of(x)[3] is None for x in (q, k, v))
    return True


def varying_alike(args: Sequence[jax.Array]) -> list[jax.Array]:
    """Every operand varying over the same manual axes (a kernel's operands share one type;
    interpret mode checks it), e.g. replicated parameters' tangents beside a sharded batch's."""
    union = frozenset().union(*(varying_axes(a) for a in args))
    out = []
    for a in args:
        missing = tuple(sorted(union - varying_axes(a)))
        out.append(jax.lax.pcast(a, missing, to="varying") if missing else a)
    return out


def check_vma_for(backend: str) -> bool:
    """``check_vma`` for the shard_map fastgp builds around a kernel under explicit axes: off for
    the interpret modes, whose loops cannot carry manual axis types (JAX 0.10.2). The operands of
    that shard_map are all split over the mesh or replicated alike, and every derivative is
    fastgp's own rule, so no collective depends on those types."""
    return backend not in INTERPRET_BACKENDS


def _refuse_tpu_interpret_in_shard_map(backend: str) -> None:
    """TPU interpret mode inside a user's shard_map: a fastgp error where JAX 0.10.2 fails."""
    if backend == "tpu-interpret":
        raise ValueError(
            "fastgp.attention(backend='tpu-interpret') cannot run inside shard_map: TPU interpret "
            "mode's callbacks fail to lower there (JAX 0.10.2). Use backend='interpret' or 'xla'."
        )


def bind_per_device(prim: Primitive, *args: jax.Array, config: Any) -> list[jax.Array]:
    """``prim.bind(*args, config=config)`` with the kernel run per device (see the module)."""
    if config.backend == "xla":
        return prim.bind(*args, config=config)
    mode = mode_of(args[0], f"fastgp.attention(backend={config.backend!r})")
    if mode == "auto":
        message = _AUTO_MESSAGE.format(backend=config.backend)
        first = refuse_when_lowered(args[0], message, "partitioned")
        return prim.bind(first, *args[1:], config=config)
    if mode == "manual":
        _refuse_tpu_interpret_in_shard_map(config.backend)
        return prim.bind(*varying_alike(args), config=config)
    mesh = mesh_of(args[0])
    batch, heads, in_specs = _specs(args, config.backend)
    # operands sharded otherwise over batch or heads (a replicated mask) follow q
    args = tuple(
        a if spec_of(a) == tuple(spec) else jax.sharding.reshard(a, NamedSharding(mesh, spec))
        for a, spec in zip(args, in_specs, strict=True)
    )
    out_avals = prim.abstract_eval(*(jax.typeof(a) for a in args), config=config)[0]
    out_specs = [P(batch, heads, *([None] * (len(a.shape) - 2))) for a in out_avals]
    run = jax.shard_map(
        lambda *a: prim.bind(*a, config=config),
        mesh=mesh,
        in_specs=tuple(in_specs),
        out_specs=out_specs,
        check_vma=check_vma_for(config.backend),
    )
    return list(run(*args))


__all__ = ["bind_per_device", "kernels_run_per_device"]
