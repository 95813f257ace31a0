"""The sharding-mode dispatch every kernel binding shares: how a traced array is sharded.

    mode_of(x, caller)  -> "manual" | "auto" | "explicit"
    spec_of(x)          -> x's PartitionSpec entries, one per dimension

    mode        recognised by the mesh's axis types          how a kernel runs per device
    "manual"    inside shard_map (every axis Manual)         on the local block, as written
    "explicit"  every axis Explicit (the array's type        in a shard_map over the mesh,
                carries its PartitionSpec)                   in_specs from the type
    "auto"      every axis Auto, or no mesh (jax.jit with    the partitioner decides: each op
                sharded operands, or one device)             says what it does there

A mesh that mixes axis types is refused with an error naming them.
"""

from collections.abc import Iterable
from typing import Any, Literal, TypeAlias

import jax
from jax.sharding import AbstractMesh, AxisType, Mesh

Mode: TypeAlias = Literal["manual", "auto", "explicit"]
Spec: TypeAlias = tuple[Any, ...]  # PartitionSpec entries: None, a mesh axis name, or a tuple


def mesh_of(x: jax.Array) -> Mesh | AbstractMesh:
    """The mesh ``x``'s type names, else the mesh set around the trace (possibly empty)."""
    mesh = jax.typeof(x).sharding.mesh
    return mesh if not mesh.empty else jax.sharding.get_abstract_mesh()


def full_spec(spec: Iterable[Any], ndim: int) -> Spec:
    """``spec`` padded with None to one entry per array dimension."""
    spec = tuple(spec)
    return spec + (None,) * (ndim - len(spec))


def spec_of(x: jax.Array) -> Spec:
    """The PartitionSpec entries of ``x``'s type, one per dimension."""
    return full_spec(jax.typeof(x).sharding.spec, x.ndim)


def axes_of(entry: str | tuple[str, ...] | None) -> tuple[str, ...]:
    """The mesh axes of one PartitionSpec entry (None, a name, or a tuple of names)."""
    if entry is None:
        return ()
    return tuple(entry) if isinstance(entry, tuple) else (entry,)


def collective_axis(axes: tuple[str, ...]) -> str | tuple[str, ...]:
    """The axis-name argument of a collective over ``axes``: the name alone for one axis."""
    return axes if len(axes) > 1 else axes[0]


def mode_of(x: jax.Array, caller: str) -> Mode:
    """The sharding mode ``x`` is traced in; a ValueError naming ``caller`` for a mixed mesh."""
    mesh = mesh_of(x)
    types = frozenset(mesh.axis_types) if not mesh.empty else frozenset()
    if types == {AxisType.Manual}:
        return "manual"
    if types <= {AxisType.Auto}:
        return "auto"
    if types == {AxisType.Explicit}:
        return "explicit"
    axis_types = dict(zip(mesh.axis_names, mesh.axis_types, strict=True))
    raise ValueError(
        f"{caller}: an array of shape {tuple(x.shape)} sharded as {spec_of(x)} is traced on a "
        f"mesh with axis types {axis_types}; the kernels run per device when every axis is "
        f"Auto, every axis is Explicit, or inside a shard_map over every axis. Make the "
        f"shard_map cover every mesh axis, use one axis type, or use backend='xla'."
    )


__all__ = [
    "Mode",
    "Spec",
    "axes_of",
    "collective_axis",
    "full_spec",
    "mesh_of",
    "mode_of",
    "spec_of",
]
