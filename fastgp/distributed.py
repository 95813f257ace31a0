"""Global-batch reductions inside ``shard_map``, and the check that a mesh axis is not forgotten.

``axis_name`` is the data axis (or tuple of axes) the batch is split over:

    None        not inside shard_map, or data that does not vary over any manual mesh axis
    "data"      the mean is over the global batch: psum of local sums over psum of local counts
    ()          a deliberate per-shard penalty: no collectives, even on sharded data
"""

import jax
import jax.numpy as jnp
from jax import lax

from fastgp._typing import AxisName, PyTree


def varying_axes(tree: PyTree) -> frozenset[str]:
    """The manual mesh axes (inside ``shard_map(check_vma=True)``) that any leaf of ``tree`` varies
    over."""
    axes: frozenset[str] = frozenset()
    for leaf in jax.tree.leaves(tree):
        manual = getattr(jax.typeof(leaf), "manual_axis_type", None)
        if manual is not None:
            axes |= manual.varying
    return axes


def require_axis_name(
    tree: PyTree,
    axis_name: AxisName,
    what: str,
    consequence: str = "the mean would be over this shard only",
) -> None:
    """Raise a ValueError when ``tree`` varies over manual mesh axes but ``axis_name`` is None.

    Without it the mean would silently be over this shard's samples only, and the parameter
    gradients would be off by the shard count; ``consequence`` says what would go wrong.
    """
    if axis_name is not None:
        return
    axes = varying_axes(tree)
    if axes:
        names = tuple(sorted(axes))
        suggestion = names[0] if len(names) == 1 else names
        raise ValueError(
            f"{what} varies over the manual mesh axes {names} (inside shard_map), but "
            f"axis_name is None, so {consequence}. Pass "
            f"axis_name={suggestion!r} for the mean over the global batch, or axis_name=() for "
            f"a deliberate per-shard value."
        )


def _collective_axes(axis_name: AxisName) -> tuple[str, ...]:
    """The axes to reduce over: () for None or an explicit per-shard ``()``."""
    if axis_name is None:
        return ()
    return axis_name if isinstance(axis_name, tuple) else (axis_name,)


def global_sum(value: jax.Array, axis_name: AxisName = None) -> jax.Array:
    """``value`` summed over the shards of ``axis_name`` (unchanged when there are none)."""
    axes = _collective_axes(axis_name)
    return lax.psum(value, axes) if axes else value


def global_count(local_batch: int, axis_name: AxisName = None) -> jax.Array:
    """The global batch size as a float32 scalar: ``local_batch`` times the shard count.

    Static (the mesh's axis sizes are known at trace time), so it costs no collective.
    """
    return jnp.float32(local_batch * shard_count(axis_name))


def global_mean(values: jax.Array, axis_name: AxisName = None) -> jax.Array:
    """Mean of a (B_local,) array over the global batch (float32, or float64 for f64 input).

    With ``axis_name`` it is ``psum(sum) / psum(count)``: exact for any shard sizes, and identical
    on every shard.
    """
    dtype = jnp.promote_types(values.dtype, jnp.float32)
    total = global_sum(jnp.sum(values, dtype=dtype), axis_name)
    return total / global_count(values.shape[0], axis_name).astype(dtype)


def shard_count(axis_name: AxisName = None) -> int:
    """Number of shards over ``axis_name`` (1 without one), a Python int at trace time."""
    axes = _collective_axes(axis_name)
    return int(lax.psum(1, axes)) if axes else 1


def global_batch_slice(values: jax.Array, local_batch: int, axis_name: AxisName) -> jax.Array:
    """This shard's contiguous slice of a global-batch array (leading axis = global batch)."""
    axes = _collective_axes(axis_name)
    if not axes:
        return values[:local_batch]
    start = lax.axis_index(axes if len(axes) > 1 else axes[0]) * local_batch
    return lax.dynamic_slice_in_dim(values, start, local_batch, axis=0)
