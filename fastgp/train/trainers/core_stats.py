"""Per-shard training diagnostics: computed on each core, gathered so every core sees them all.

Inside ``shard_map``:
    local_norm_stats(norms)            -> {norm_mean, norm_min, norm_max: f32, nonfinite: int32}
                                          of this core's norms (``fastgp.diagnostics.norm_stats``)
    skipped_norm_stats(axis_name)      -> the same for a step without a penalty (NaN, NaN, NaN, 0)
    (``fastgp.diagnostics.per_device`` gathers them with the losses, in one collective)

On the host:
    summarize(metrics)                 -> floats of the last step, for logs and progress bars
    replica_spread(metrics)            -> largest disagreement between cores on a global value
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from fastgp.diagnostics import norm_stats


def local_norm_stats(norms: jax.Array) -> dict[str, jax.Array]:
    """This core's statistics of its (B_local,) norms, as scalars to gather with the losses."""
    return {name: value[0] for name, value in norm_stats(norms, axis_name=()).items()}


def skipped_norm_stats(axis_name: str) -> dict[str, jax.Array]:
    """Stats for a critic step whose penalty was skipped (lazy regularisation): nothing measured."""
    nan = lax.pcast(jnp.float32(jnp.nan), axis_name, to="varying")
    return {
        "norm_mean": nan,
        "norm_min": nan,
        "norm_max": nan,
        "nonfinite": lax.pcast(jnp.int32(0), axis_name, to="varying"),
    }


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


__all__ = ["local_norm_stats", "replica_spread", "skipped_norm_stats", "summarize"]
