"""Per-device statistics of the input-gradient norms: on which device, and how, a penalty goes
wrong.

    norm_stats(norms, axis_name=None, *, shards=1)   -> {norm_mean, norm_min, norm_max, nonfinite}
    per_device(values, axis_name)                    -> every device's values, in one collective

``norms`` are the per-sample norms of :func:`fastgp.gradient_penalty_and_norms`. Inside
``shard_map`` each device's statistics are of its own samples, gathered over the batch axes
``axis_name`` so that every device holds every device's; under ``jax.jit`` (the norms the global
batch) they are of ``shards`` equal slices of the batch, as a batch-sharded array lies on its
devices. Mean, min and max are of the finite norms (NaN where a device has none) and
``nonfinite`` counts the others, so a NaN in one sample neither hides the rest nor goes unseen.
"""

from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from fastgp._sharding import collective_axis
from fastgp._typing import AxisName
from fastgp.distributed import collective_axes, require_axis_name, varying_axes


def _stats(norms: jax.Array) -> dict[str, jax.Array]:
    """(..., b) norms -> (...) statistics of the last axis."""
    norms = norms.astype(jnp.float32)
    finite = jnp.isfinite(norms)
    count = jnp.sum(finite, axis=-1)
    total = jnp.sum(jnp.where(finite, norms, 0.0), axis=-1)
    nan = jnp.float32(jnp.nan)
    return {
        "norm_mean": jnp.where(count > 0, total / jnp.maximum(count, 1), nan),
        "norm_min": jnp.where(count > 0, jnp.min(jnp.where(finite, norms, jnp.inf), axis=-1), nan),
        "norm_max": jnp.where(count > 0, jnp.max(jnp.where(finite, norms, -jnp.inf), axis=-1), nan),
        "nonfinite": jnp.sum(~finite, axis=-1, dtype=jnp.int32),
    }


def norm_stats(
    norms: jax.Array, axis_name: AxisName = None, *, shards: int = 1
) -> dict[str, jax.Array]:
    """Each device's norm statistics, each of shape (n,): float32 ``norm_mean``, ``norm_min``,
    ``norm_max`` (of the finite norms) and int32 ``nonfinite``.

    Inside ``shard_map``: ``norms`` (B_local,) are this device's and ``axis_name`` the batch axes
    (as given to the penalty); n is their device count, entry i the device at index i along
    them, the same on every device. Otherwise ``norms`` (B,) are the whole batch and n is
    ``shards``: entry i the samples [i B / n, (i + 1) B / n). Raises ValueError for norms that
    are not (B,), a B that ``shards`` does not divide, or norms that vary over a mesh axis
    ``axis_name`` does not name.
    """
    norms = jnp.asarray(norms)
    if norms.ndim != 1:
        raise ValueError(f"norm_stats: norms must be per sample, (B,); got shape {norms.shape}")
    require_axis_name(norms, axis_name, "norm_stats: norms", "each device's statistics would mix")
    if collective_axes(axis_name):
        return per_device(_stats(norms), axis_name)
    if shards < 1 or norms.shape[0] % shards:
        raise ValueError(
            f"norm_stats: shards={shards} must divide the batch of {norms.shape[0]} norms (one "
            f"slice per device holding the batch)"
        )
    return _stats(norms.reshape(shards, -1))


def per_device(values: dict[str, Any], axis_name: AxisName) -> dict[str, jax.Array]:
    """Inside ``shard_map``: every device's ``values`` along the mesh axes ``axis_name``, each
    ``shape -> shape + (n,)`` and the same on every device, in one collective.

    Each device writes its values, flattened to float32, into its own row of an (n, K) table of
    zeros and one ``psum`` assembles it: each entry is one device's value plus zeros, so it is
    exact and a NaN or inf stays in its own entry. int32 values come back exact below 2^24.
    """
    axes = collective_axes(axis_name)
    if not axes:
        raise ValueError("per_device: name the mesh axes to gather over (axis_name)")
    axis = collective_axis(axes)
    names = list(values)
    arrays = [jnp.asarray(values[n]) for n in names]
    local = jnp.concatenate([a.astype(jnp.float32).reshape(-1) for a in arrays])
    invariant = tuple(a for a in axes if a not in varying_axes(local))
    if invariant:
        local = lax.pcast(local, invariant, to="varying")
    devices = lax.psum(1, axis)
    rows = jnp.zeros((devices, local.size), jnp.float32)
    rows = lax.dynamic_update_index_in_dim(rows, local, lax.axis_index(axis), axis=0)
    table = lax.psum(rows, axis)
    out, start = {}, 0
    for name, a in zip(names, arrays, strict=True):
        column = table[:, start : start + a.size].reshape((devices,) + a.shape)
        out[name] = jnp.moveaxis(column, 0, -1).astype(a.dtype)
        start += a.size
    return out


__all__ = ["norm_stats", "per_device"]
