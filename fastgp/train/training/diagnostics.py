"""Per-shard training diagnostics: computed on each core, gathered so every core sees them all.

Inside ``shard_map``:
    norm_stats(norms)                  -> {norm_mean, norm_min, norm_max: f32, nonfinite: int32}
    skipped_norm_stats(axis_name)      -> the same for a step without a penalty (NaN, NaN, NaN, 0)
    gather(values, axis_name)          -> each value gains a trailing (n_devices,) axis, replicated
                                          (all of them in one packed collective)

On the host:
    summarize(metrics)                 -> floats of the last step, for logs and progress bars
    replica_spread(metrics)            -> largest disagreement between cores on a global value
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def norm_stats(norms: jax.Array) -> dict[str, jax.Array]:
    """Statistics of this shard's (B_local,) float32 input-gradient norms (local scalars)."""
    return {
        "norm_mean": jnp.mean(norms),
        "norm_min": jnp.min(norms),
        "norm_max": jnp.max(norms),
        "nonfinite": jnp.sum(~jnp.isfinite(norms), dtype=jnp.int32),
    }


def skipped_norm_stats(axis_name: str) -> dict[str, jax.Array]:
    """Stats for a critic step whose penalty was skipped (lazy regularisation): nothing measured."""
    nan = lax.pcast(jnp.float32(jnp.nan), axis_name, to="varying")
    return {
        "norm_mean": nan,
        "norm_min": nan,
        "norm_max": nan,
        "nonfinite": lax.pcast(jnp.int32(0), axis_name, to="varying"),
    }


def gather(values: Any, axis_name: str) -> Any:
    """Every core's values, each ``shape -> shape + (n_devices,)`` and identical on every core, in
    ONE collective.

    Each core writes its values, flattened to float32, into its own row of an (n_devices, K) zero
    matrix, and one psum assembles the table (each entry is one core's value plus zeros: exact,
    NaN and inf stay in their own entry). Values already identical on every core (psum'd losses)
    are gathered too, so a host can check that the replicas agree. int32 counts come back exact
    below 2^24.
    """
    names = list(values)
    arrays = [jnp.asarray(values[n]) for n in names]
    local = jnp.concatenate([a.astype(jnp.float32).reshape(-1) for a in arrays])
    if axis_name not in jax.typeof(local).manual_axis_type.varying:
        local = lax.pcast(local, axis_name, to="varying")
    devices = lax.psum(1, axis_name)
    rows = jnp.zeros((devices, local.size), jnp.float32)
    rows = lax.dynamic_update_index_in_dim(rows, local, lax.axis_index(axis_name), axis=0)
    table = lax.psum(rows, axis_name)
    out, start = {}, 0
    for name, a in zip(names, arrays, strict=True):
        column = table[:, start : start + a.size].reshape((devices,) + a.shape)
        out[name] = jnp.moveaxis(column, 0, -1).astype(a.dtype)
        start += a.size
    return out


def summarize(metrics: dict[str, Any]) -> dict[str, Any]:
    """Host floats of the last critic and generator step of a ``Trainer.run`` metrics dict.

    Losses are taken from core 0 (``replica_spread``: how far the cores disagree over all steps);
    norm statistics are combined over cores (mean of means, min of mins, ...).
    """
    last = {name: np.asarray(value)[-1] for name, value in metrics.items()}
    critic = {
        name: value[-1]
        for name, value in last.items()
        if name not in ("generator_loss", "gp_applied")
    }
    return {
        "critic_loss": float(critic["critic_loss"][0]),
        "penalty": float(critic["penalty"][0]),
        "wasserstein": float(critic["wasserstein"][0]),
        "generator_loss": float(last["generator_loss"][0]),
        "gp_applied": bool(last["gp_applied"][-1]),
        "norm_mean": float(np.mean(critic["norm_mean"])),
        "norm_min": float(np.min(critic["norm_min"])),
        "norm_max": float(np.max(critic["norm_max"])),
        "nonfinite": int(np.sum(critic["nonfinite"])),
        "replica_spread": replica_spread(metrics),
    }


def replica_spread(metrics: dict[str, Any]) -> float:
    """Largest disagreement between cores on a global value over all steps (0.0 when healthy)."""
    names = ("critic_loss", "penalty", "wasserstein", "generator_loss")
    return max(float(np.max(np.ptp(np.asarray(metrics[n]), axis=-1))) for n in names)


__all__ = ["gather", "norm_stats", "replica_spread", "skipped_norm_stats", "summarize"]
