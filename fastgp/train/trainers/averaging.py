"""The generator's exponential moving average of its parameters (StyleGAN's and R3GAN's G_ema),
kept as the last transformation of its optimiser so that both trainers, checkpoints and resume
carry it with the Adam state and nothing else changes.

    averaged(optimizer, half_life)  -> optax transformation: ``optimizer``, then the average
    average_of(opt_state, half_life) -> the debiased average parameters of such a state
    sampling_params(state, half_life) -> what samples are drawn with: the average, or the
                                       parameters themselves (half-life 0, or before any step)
    decay(half_life)                -> the per-step decay 0.5 ** (1 / half_life)

The average starts at zero and is divided by 1 - decay ** t (Adam's bias correction), so it is
the initial parameters' weight that vanishes, not the early steps': after t steps it is the
decay-weighted mean of the parameters after each of the t updates, whatever ``half_life``.
"""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax


class AverageState(NamedTuple):
    """The running sum ``total`` (the parameters' pytree, float32) and the steps it holds,
    ``steps`` (int32 scalar)."""

    total: Any
    steps: jax.Array


def decay(half_life: int) -> float:
    """Per-step decay of an average whose weights halve every ``half_life`` steps (>= 1)."""
    return 0.5 ** (1.0 / half_life)


def _average(half_life: int) -> optax.GradientTransformation:
    """Pass the updates through; keep the moving average of the parameters they lead to."""
    beta = decay(half_life)

    def init(params: Any) -> AverageState:
        zeros = jax.tree.map(lambda p: jnp.zeros_like(p, jnp.float32), params)
        return AverageState(zeros, jnp.zeros((), jnp.int32))

    def update(updates: Any, state: AverageState, params: Any = None) -> tuple[Any, Any]:
        if params is None:
            raise ValueError("the parameter average needs the parameters: pass params to update")
        new = optax.apply_updates(params, updates)
        total = jax.tree.map(lambda t, p: beta * t + (1.0 - beta) * p, state.total, new)
        return updates, AverageState(total, state.steps + 1)

    return optax.GradientTransformation(init, update)


def averaged(optimizer: optax.GradientTransformation, half_life: int) -> Any:
    """``optimizer`` followed by the parameter average of ``half_life`` steps (``half_life``
    >= 1); its state is ``(optimizer's state, AverageState)``."""
    return optax.chain(optimizer, _average(half_life))


def average_of(opt_state: Any, half_life: int) -> Any:
    """The debiased average parameters held by an :func:`averaged` optimiser's state; before
    the first step there is no average: ValueError."""
    state = opt_state[-1]
    if not isinstance(state, AverageState):
        raise ValueError("this optimiser state holds no parameter average (half-life 0?)")
    steps = jnp.asarray(state.steps)
    if int(steps) == 0:
        raise ValueError("the parameter average holds no step yet")
    correction = 1.0 - decay(half_life) ** steps.astype(jnp.float32)
    return jax.tree.map(lambda t: t / correction, state.total)


def sampling_params(state: Any, half_life: int) -> Any:
    """The generator parameters a run's samples come from: with ``half_life`` >= 1 the average
    in ``state.g_opt`` once it holds a step, else ``state.g_params``."""
    if half_life == 0 or int(state.g_opt[-1].steps) == 0:
        return state.g_params
    return average_of(state.g_opt, half_life)


__all__ = ["AverageState", "average_of", "averaged", "decay", "sampling_params"]
