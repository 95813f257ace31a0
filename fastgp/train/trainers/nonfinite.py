"""Numerical faults of a training chunk: the first non-finite loss, or a non-finite state.

    first_nonfinite_loss(metrics, start)   -> description or None   (``Trainer.run`` metrics)
    nonfinite_state(state)                 -> description or None   (replicated TrainState)

Losses are scanned in the order they were computed (each critic step's critic loss, penalty and
Wasserstein estimate, then the generator loss), so the description names the first one that
went non-finite and its generator step.
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

CRITIC_LOSSES = ("critic_loss", "penalty", "wasserstein")


def _value(v: Any) -> str:
    return "nan" if np.isnan(v) else ("inf" if v > 0 else "-inf")


def first_nonfinite_loss(metrics: dict[str, Any], start: int) -> str | None:
    """The first non-finite loss of a chunk that began after generator step ``start``.

    ``metrics`` holds ``critic_loss``, ``penalty``, ``wasserstein`` (I, C, N) and
    ``generator_loss`` (I, N) as returned by ``Trainer.run``; every core holds the global value,
    so core 0's is read."""
    critic = {name: np.asarray(metrics[name])[..., 0] for name in CRITIC_LOSSES}  # (I, C)
    generator = np.asarray(metrics["generator_loss"])[..., 0]  # (I,)
    _, n_critic = critic["critic_loss"].shape  # (iterations, n_critic)
    bad = ~np.isfinite(generator)
    for name in CRITIC_LOSSES:
        bad |= ~np.all(np.isfinite(critic[name]), axis=1)
    if not bad.any():
        return None
    i = int(np.flatnonzero(bad)[0])
    for c in range(n_critic):
        for name in CRITIC_LOSSES:
            v = critic[name][i, c]
            if not np.isfinite(v):
                return (
                    f"{name} is {_value(v)} at step {start + i + 1} (critic step {c + 1} "
                    f"of {n_critic})"
                )
    return f"generator_loss is {_value(generator[i])} at step {start + i + 1}"


@jax.jit
def _finite_leaves(trees: Any) -> Any:
    """One bool per leaf of ``trees``, in leaf order: one program and one transfer for the whole
    state, which the run loop checks after every chunk."""
    return jnp.stack([jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree.leaves(trees)])


STATE_PARTS = (
    ("generator parameters", "g_params"),
    ("critic parameters", "d_params"),
    ("generator optimiser state", "g_opt"),
    ("critic optimiser state", "d_opt"),
)


def nonfinite_state(state: Any) -> str | None:
    """ "critic parameters d_params[1]['w'] hold non-finite values" for the first non-finite
    array of the parameters, then of the Adam states (a squared gradient can overflow while the
    parameters stay finite), or None."""
    trees = [getattr(state, field) for _, field in STATE_PARTS]
    names = [
        f"{label} {field}{jax.tree_util.keystr(path)}"
        for (label, field), tree in zip(STATE_PARTS, trees, strict=True)
        for path, _ in jax.tree_util.tree_leaves_with_path(tree)
    ]
    finite = np.asarray(jax.device_get(_finite_leaves(trees)))
    for name, ok in zip(names, finite, strict=True):
        if not ok:
            return f"{name} hold non-finite values"
    return None


__all__ = ["first_nonfinite_loss", "nonfinite_state"]
