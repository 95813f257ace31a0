"""Public gradient-penalty API.

    grad_norms(grads)                          -> (B,) float32 per-sample L2 norms
    penalty_from_grads(grads, kind, ...)       -> scalar float32
    gradient_penalty(critic, x, kind, ...)     -> scalar float32
    interpolate(key, real, fake)               -> x_hat, one alpha ~ U[0, 1] per sample

``grads`` and ``x`` are arrays or pytrees of arrays sharing a leading batch axis B. Norms always
accumulate in float32, whatever the input dtype. See the README for the maths and the backends.
"""

import jax
import jax.numpy as jnp

from fastgp import checks
from fastgp.distributed import global_batch_slice, global_mean
from fastgp.rowops import norms_and_penalties


def per_sample_penalties(grads, *, kind="wgan-gp", target=1.0, backend="auto"):
    """(norms, penalties), each (B,) float32, for a pytree of (B, ...) input-gradients."""
    checks.check_kind(kind)
    checks.check_backend(backend)
    target = checks.check_target(target)
    rows, _ = checks.rows_of(grads, "grads")
    return norms_and_penalties(rows, kind, target, backend)


def grad_norms(grads, *, backend="auto"):
    """(B,) float32 L2 norm of each sample's gradient over every leaf and non-batch element."""
    norms, _ = per_sample_penalties(grads, kind="r1", backend=backend)
    return norms


def penalty_and_norms_from_grads(grads, *, kind="wgan-gp", target=1.0, weight=1.0,
                                 backend="auto", axis_name=None):
    """(``weight * mean_b p(n_b)`` over the global batch, (B_local,) float32 norms)."""
    weight = checks.check_weight(weight)
    norms, penalties = per_sample_penalties(grads, kind=kind, target=target, backend=backend)
    return weight * global_mean(penalties, axis_name), norms


def penalty_from_grads(grads, *, kind="wgan-gp", target=1.0, weight=1.0, backend="auto",
                       axis_name=None):
    """``weight * mean_b p(n_b)`` over the global batch (psum'd over ``axis_name`` if given)."""
    penalty, _ = penalty_and_norms_from_grads(grads, kind=kind, target=target, weight=weight,
                                              backend=backend, axis_name=axis_name)
    return penalty


def input_gradients(critic, x):
    """(scores (B,), d sum(scores) / dx) for a per-sample critic; gradients share x's structure."""
    _, batch = checks.rows_of(x, "x")
    scores, pullback = jax.vjp(critic, x)
    flat = checks.check_scores(scores, batch)
    (grads,) = pullback(jnp.ones_like(scores))
    return flat, grads


def gradient_penalty_and_norms(critic, x, *, kind="wgan-gp", target=1.0, weight=10.0,
                               backend="auto", axis_name=None):
    """Like :func:`gradient_penalty`, also returning the (B_local,) float32 input-gradient norms."""
    weight = checks.check_weight(weight)
    _, grads = input_gradients(critic, x)
    return penalty_and_norms_from_grads(grads, kind=kind, target=target, weight=weight,
                                        backend=backend, axis_name=axis_name)


def gradient_penalty(critic, x, *, kind="wgan-gp", target=1.0, weight=10.0, backend="auto",
                     axis_name=None):
    """Gradient penalty of ``critic`` at points ``x`` (scalar float32).

    ``critic`` maps x (B, ...) to scores (B,) or (B, 1) and must treat samples independently (no
    batch norm). Close over the critic's parameters; ``jax.grad`` of this with respect to them is
    the second-order gradient, taken through the fused kernels' custom VJPs.
    """
    penalty, _ = gradient_penalty_and_norms(critic, x, kind=kind, target=target, weight=weight,
                                            backend=backend, axis_name=axis_name)
    return penalty


def interpolate(key, real, fake, *, axis_name=None):
    """``real + alpha * (fake - real)`` with one alpha ~ U[0, 1] per sample, shared by all leaves.

    Inside ``shard_map`` pass ``axis_name``: alpha is then drawn for the global batch and each
    shard takes its own slice, so the result equals the single-device one for the same key.
    """
    checks.check_same_structure(real, fake)
    _, batch = checks.rows_of(real, "real")
    if axis_name is None:
        alpha = jax.random.uniform(key, (batch,), jnp.float32)
    else:
        shards = jax.lax.psum(1, axis_name)
        alpha = jax.random.uniform(key, (batch * shards,), jnp.float32)
        alpha = global_batch_slice(alpha, batch, axis_name)

    def mix(r, f):
        a = alpha.reshape((batch,) + (1,) * (r.ndim - 1)).astype(r.dtype)
        return r + a * (f - r)

    return jax.tree.map(mix, real, fake)


__all__ = [
    "gradient_penalty",
    "gradient_penalty_and_norms",
    "grad_norms",
    "input_gradients",
    "interpolate",
    "penalty_and_norms_from_grads",
    "penalty_from_grads",
    "per_sample_penalties",
]
