"""Per-sample kernels that partition themselves: every device reduces its own block of the leaf.

    per_device(block_sumsq, backend)(leaf) -> (B,) float32 sums of squares of a (B, ...) leaf

``block_sumsq`` is a kernel call on one device's (b, ...) block (it picks its own view of the
block, see ``fastgp._penalty.binding``). How the wrapped call reaches it depends on the sharding
mode of the program being traced (``fastgp._sharding``):

    mode (recognised by the mesh's axis types)      mechanism
    inside shard_map (every axis Manual)            the kernel on the local block, as written
    explicit sharding (Explicit axes: the leaf's    shard_map over the mesh, in_specs from the
      type carries its PartitionSpec)                 leaf's type
    jax.jit with sharded operands (Auto axes, or    custom_partitioning: a Shardy sharding rule
      no mesh: the partitioner decides)               and GSPMD callbacks; XLA calls back with the
                                                      leaf's sharding and lowers one block's call
    one device                                      the kernel, inlined

In every partitioned mode a batch-sharded leaf gives batch-sharded sums with no collective, a leaf
sharded along reduced (non-batch) axes gives partial sums and one psum over those mesh axes, and a
replicated leaf stays local: the leaf is never gathered. What cannot be partitioned raises a
ValueError that names the leaf's sharding and the alternatives: a reduced axis split unevenly, a
sharding that is not a PartitionSpec of a named mesh, a mesh that mixes Auto with Explicit or
Manual axes, and, under Auto sharding over several devices, the kernels that custom_partitioning
cannot carry: the Mosaic kernel on TPU (XLA:TPU has no partitioner for custom_partitioning,
jax-ml/jax#38196) and TPU interpret mode (its host callbacks cannot enter the per-block program).
Those two run under explicit sharding and inside shard_map.
"""

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
from jax import lax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.sharding import AbstractMesh, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from fastgp._refusals import refuse_when_lowered
from fastgp._sharding import Spec, axes_of, full_spec, mesh_of, mode_of, spec_of

BlockSumsq = Callable[[jax.Array], jax.Array]  # (b, ...) block -> (b,) sums of squares


# --- PartitionSpec arithmetic -------------------------------------------------------------------


def reduced_mesh_axes(spec: Sequence[Any]) -> tuple[str, ...]:
    """The mesh axes that split a reduced (non-batch) dimension: the psum the sums need."""
    return tuple(axis for entry in spec[1:] for axis in axes_of(entry))


def _describe(shape: Sequence[int], spec: Iterable[Any]) -> str:
    return f"a leaf of shape {tuple(shape)} sharded as {P(*spec)}"


def check_even(
    shape: Sequence[int], spec: Sequence[Any], axis_sizes: Mapping[str, int], backend: str
) -> None:
    """Every sharded reduced dimension must split evenly: its padding would be summed. (A ragged
    batch is fine: the padded samples' sums are discarded with the padding.)"""
    # A spec may be shorter than the shape: the dimensions past it are not split.
    for dim, (size, entry) in enumerate(zip(shape, spec, strict=False)):
        if dim == 0:
            continue
        shards = math.prod(axis_sizes[axis] for axis in axes_of(entry))
        if size % shards:
            raise ValueError(
                f"backend={backend!r}: {_describe(shape, spec)} splits dimension {dim} "
                f"(size {size}) over {shards} devices unevenly, and the kernel would sum the "
                f"padding. Shard that dimension over a mesh axis whose size divides it, or use "
                f"backend='xla'."
            )


def _block_sums(block_sumsq: BlockSumsq, spec: Sequence[Any]) -> BlockSumsq:
    """One device's (b,) sums: the kernel on its block, psum'd over the reduced mesh axes."""
    axes = reduced_mesh_axes(spec)

    def sums(block: jax.Array) -> jax.Array:
        partial = block_sumsq(block)
        return lax.psum(partial, axes) if axes else partial

    return sums


# --- Explicit sharding: the leaf's type says where each block lives ------------------------------


def _explicit(
    block_sumsq: BlockSumsq, leaf: jax.Array, mesh: Mesh | AbstractMesh, backend: str
) -> jax.Array:
    spec = spec_of(leaf)
    check_even(leaf.shape, spec, mesh.shape, backend)
    # check_vma=False: this shard_map is only ever on the primal path (the derivative is the jnp
    # custom_jvp of ``rowops``), and generic interpret mode cannot carry varying manual-axis types
    # through its while loop (JAX 0.10.2).
    return jax.shard_map(
        _block_sums(block_sumsq, spec),
        mesh=mesh,
        in_specs=P(*spec),
        out_specs=P(spec[0]),
        check_vma=False,
    )(leaf)


# --- Refusals, checked when the program is lowered ---------------------------------------------

# Why a kernel cannot be custom-partitioned, where it cannot: completes "...; it cannot run ..."
HOST_CALLBACKS = (
    "it simulates the TPU through host callbacks, which custom_partitioning cannot "
    "carry into the per-device program"
)
NO_TPU_PARTITIONER = (
    'XLA:TPU has no partitioner for custom_partitioning ops ("Custom emitter '
    'for CustomSPMDPartitioning not found", jax-ml/jax#38196)'
)


def _single_device_only(block_sumsq: BlockSumsq, backend: str, reason: str) -> BlockSumsq:
    message = (
        f"backend={backend!r} cannot run on this Auto-sharded program over several "
        f"devices: {reason}; it would otherwise gather every leaf onto each device. Run "
        f"the step under explicit sharding (jax.make_mesh's default axis types, arrays "
        f"placed with NamedSharding, jax.set_mesh) or inside shard_map, where "
        f"{backend!r} runs per device, or use backend='auto'."
        + (
            " On CPU, backend='interpret' runs the same kernel partitioned per device."
            if reason is HOST_CALLBACKS
            else ""
        )
    )
    return lambda leaf: block_sumsq(refuse_when_lowered(leaf, message, "partitioned"))


# --- Auto sharding: the partitioner decides and calls back --------------------------------------


def _named_sharding(arg: Any, backend: str) -> NamedSharding:
    sharding = arg.sharding
    if not isinstance(sharding, NamedSharding):
        raise ValueError(
            f"backend={backend!r}: the partitioner gave a leaf of shape {tuple(arg.shape)} the "
            f"sharding {sharding}, which is not a PartitionSpec over a named mesh, so the kernel "
            f"cannot be split per device without gathering the leaf. Shard the step's inputs "
            f"with NamedSharding on one jax.sharding.Mesh, run the penalty inside shard_map, or "
            f"use backend='xla'."
        )
    return sharding


def _auto(block_sumsq: BlockSumsq, backend: str) -> BlockSumsq:
    """``block_sumsq`` as a custom_partitioning op: (B, ...) leaf -> (B,) sums."""

    @custom_partitioning
    def partitioned(leaf: jax.Array) -> jax.Array:
        return block_sumsq(leaf)

    def layout(arg: Any) -> tuple[NamedSharding, Spec]:
        sharding = _named_sharding(arg, backend)
        return sharding, full_spec(sharding.spec, len(arg.shape))

    def infer_sharding_from_operands(
        mesh: Any, arg_shapes: Sequence[Any], result_shape: Any
    ) -> NamedSharding:
        sharding, spec = layout(arg_shapes[0])
        return NamedSharding(sharding.mesh, P(spec[0]))

    def partition(
        mesh: Any, arg_shapes: Sequence[Any], result_shape: Any
    ) -> tuple[Any, BlockSumsq, NamedSharding, tuple[NamedSharding]]:
        (arg,) = arg_shapes
        sharding, spec = layout(arg)
        check_even(arg.shape, spec, sharding.mesh.shape, backend)
        return (
            sharding.mesh,
            _block_sums(block_sumsq, spec),
            NamedSharding(sharding.mesh, P(spec[0])),
            (sharding,),
        )

    def sharding_rule(
        mesh: Any, operand_types: Sequence[Any], result_types: Any
    ) -> tuple[str, dict[str, tuple[str, ...]]]:
        reduced = tuple(f"r{dim}" for dim in range(1, len(operand_types[0].shape)))
        return f"b {' '.join(reduced)} -> b", {"reduction_factors": reduced}

    partitioned.def_partition(
        partition=partition,
        infer_sharding_from_operands=infer_sharding_from_operands,
        sharding_rule=sharding_rule,
    )
    export_message = (
        f"backend={backend!r} under Auto sharding over several devices partitions the kernel "
        f"with custom_partitioning, whose Python callbacks an exported program cannot hold. "
        f"Export the step under explicit sharding (jax.make_mesh's default axis types, "
        f"jax.set_mesh), where the kernel runs in a shard_map, or use backend='auto'."
    )
    return _merging_vmapped_batches(
        lambda leaf: partitioned(refuse_when_lowered(leaf, export_message, "exported-partitioned"))
    )


def _merging_vmapped_batches(sumsq: BlockSumsq) -> BlockSumsq:
    """``sumsq`` under ``jax.vmap`` too (custom_partitioning has no batching rule): a vmapped
    (V, B, ...) leaf is reduced as one (V * B, ...) batch."""

    @jax.custom_batching.custom_vmap
    def batchable(leaf: jax.Array) -> jax.Array:
        return sumsq(leaf)

    @batchable.def_vmap
    def _vmapped(
        axis_size: int, in_batched: Sequence[bool], leaf: jax.Array
    ) -> tuple[jax.Array, bool]:
        if not in_batched[0]:
            return batchable(leaf), False
        sums = batchable(leaf.reshape((axis_size * leaf.shape[1],) + leaf.shape[2:]))
        return sums.reshape(leaf.shape[:2]), True

    return batchable


# --- Dispatch on the sharding mode --------------------------------------------------------------


def per_device(
    block_sumsq: BlockSumsq, backend: str, *, unpartitionable: str | None = None
) -> BlockSumsq:
    """``block_sumsq`` run on every device's block of the leaf, in any sharding mode.

    Args:
      block_sumsq: (b, ...) block -> (b,) float32 sums of squares, on one device.
      backend: the backend's name, for error messages.
      unpartitionable: why custom_partitioning cannot carry this kernel (``HOST_CALLBACKS``,
        ``NO_TPU_PARTITIONER``), or None; if given, under Auto sharding the kernel runs on one
        device only, and a program over several devices is refused when it is lowered.

    Returns:
      (B, ...) leaf -> (B,) float32, sharded like the leaf's batch axis.
    """
    if unpartitionable is None:
        auto = _auto(block_sumsq, backend)
    else:
        auto = _single_device_only(block_sumsq, backend, unpartitionable)

    def sumsq(leaf: jax.Array) -> jax.Array:
        mode = mode_of(leaf, f"backend={backend!r}")
        if mode == "manual":
            return block_sumsq(leaf)
        if mode == "explicit":
            return _explicit(block_sumsq, leaf, mesh_of(leaf), backend)
        return auto(leaf)

    return sumsq


__all__ = [
    "HOST_CALLBACKS",
    "NO_TPU_PARTITIONER",
    "check_even",
    "per_device",
    "reduced_mesh_axes",
]
