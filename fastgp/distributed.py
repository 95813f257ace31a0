"""Global-batch reductions inside ``shard_map``, and the check that no mesh axis is forgotten.

Inside ``shard_map`` a mesh axis that the data varies over splits either the batch or each sample:

``axis_name``: the axes (a name or a tuple) that split the **batch**; the mean is over them.

    None        not inside shard_map, or data that does not vary over any manual mesh axis
    "data"      the mean is over the global batch: psum of local sums over psum of local counts
    ()          a deliberate per-shard penalty: no collectives, even on sharded data

``sample_axis_name``: the axes that split **each sample** (its tokens, rows or features, as
sequence parallelism does); a sample's squared gradient is summed over them inside its norm.

Data that varies over a manual axis that neither names is an error naming that axis
(:func:`require_axis_name`), unless ``axis_name=()`` asks for a per-shard value.
"""

import jax
import jax.numpy as jnp
from jax import lax

from fastgp._sharding import collective_axis
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


# What a forgotten mesh axis does to the penalty (the default consequence an error names).
SLICES_AS_SAMPLES = "the penalty would treat each shard's slice as whole samples"


def require_axis_name(
    tree: PyTree,
    axis_name: AxisName,
    what: str,
    consequence: str = SLICES_AS_SAMPLES,
    sample_axis_name: AxisName = None,
) -> None:
    """Raise a ValueError when ``tree`` varies over a manual mesh axis that neither ``axis_name``
    (batch axes) nor ``sample_axis_name`` (sample axes) names; ``axis_name=()`` opts out.

    A forgotten batch axis makes the mean this shard's only and the parameter gradients off by
    the shard count; a forgotten sample axis makes each slice of a sample a sample of its own.
    The message names both spellings for every such axis and suggests no single one, because
    only the user knows which kind each axis is. ``consequence`` says what would go wrong.
    """
    if axis_name == ():
        return
    named = set(collective_axes(axis_name)) | set(collective_axes(sample_axis_name))
    unnamed = tuple(sorted(varying_axes(tree) - named))
    if not unnamed:
        return
    spelled = unnamed[0] if len(unnamed) == 1 else unnamed
    raise ValueError(
        f"{what} varies over the manual mesh axes {unnamed} (inside shard_map), which neither "
        f"axis_name={axis_name!r} nor sample_axis_name={sample_axis_name!r} names, so "
        f"{consequence}. Name each axis by what it splits: in axis_name if it splits the "
        f"batch (the mean is over it), in sample_axis_name if it splits each sample's tokens, "
        f"rows or features (the norm sums over it); e.g. axis_name={spelled!r} for data "
        f"parallelism, or sample_axis_name={spelled!r} for sequence parallelism. "
        f"axis_name=() asks for a deliberate per-shard value."
    )


def collective_axes(axis_name: AxisName) -> tuple[str, ...]:
    """The axes to reduce over: () for None or an explicit per-shard ``()``."""
    if axis_name is None:
        return ()
    return axis_name if isinstance(axis_name, tuple) else (axis_name,)


def check_axis_kinds(axis_name: AxisName, sample_axis_name: AxisName) -> None:
    """No mesh axis may split both the batch and each sample."""
    both = set(collective_axes(axis_name)) & set(collective_axes(sample_axis_name))
    if both:
        raise ValueError(
            f"mesh axes {tuple(sorted(both))} are named both in axis_name={axis_name!r} (axes "
            f"that split the batch) and in sample_axis_name={sample_axis_name!r} (axes that split "
            f"each sample); an axis splits one or the other"
        )


def global_sum(value: jax.Array, axis_name: AxisName = None) -> jax.Array:
    """``value`` summed over the shards of ``axis_name`` (unchanged when there are none)."""
    axes = collective_axes(axis_name)
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
    axes = collective_axes(axis_name)
    return int(lax.psum(1, axes)) if axes else 1


def global_batch_slice(values: jax.Array, local_batch: int, axis_name: AxisName) -> jax.Array:
    """This shard's contiguous slice of a global-batch array (leading axis = global batch)."""
    axes = collective_axes(axis_name)
    if not axes:
        return values[:local_batch]
    start = lax.axis_index(collective_axis(axes)) * local_batch
    return lax.dynamic_slice_in_dim(values, start, local_batch, axis=0)
