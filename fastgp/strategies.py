"""Alternative ways to differentiate the gradient penalty, and critic rematerialisation.

    gradient_penalty(critic, x, *, second_order="reverse", remat=None, ...) -> scalar float32
    remat_critic(critic, remat)                                               -> critic

``second_order`` chooses how ``jax.grad`` of the penalty with respect to whatever ``critic`` closes
over (its parameters) is computed:

* ``"reverse"`` (default): reverse-over-reverse, i.e. nested ``jax.grad`` through
  :func:`fastgp.penalty.gradient_penalty` and its kernels' custom VJPs.
* ``"forward"``: forward-over-reverse. With ``g = d sum(D(x)) / dx`` and ``v = dP / dg`` (the
  per-sample scaled input-gradient, from the fused kernels), the parameter gradient of the penalty
  is ``(dg / dθ)^T v = d/dθ <d sum(D(x)) / dx, v> = d/dθ jvp(D, x, v)``. The penalty is returned as
  ``stop_gradient(P) + J - stop_gradient(J)`` with ``J = sum(jvp(D, (x,), (v,))[1])``: its value is
  P and its first derivative (in the parameters and in ``x``) is the penalty's. Higher derivatives
  of this surrogate are not those of the penalty; use ``"reverse"`` for those.

``remat`` wraps the critic in ``jax.checkpoint`` inside the penalty, so the activations of the
input-gradient pass are recomputed in the outer backward instead of kept alive:
``None`` (off), ``"nothing"`` (``nothing_saveable``: save only the critic's inputs) or ``"dots"``
(``dots_with_no_batch_dims_saveable``: keep the weight-stationary matmul outputs).
"""

import jax
import jax.numpy as jnp
from jax import lax

from fastgp import checks, penalty

SECOND_ORDER = ("reverse", "forward")
REMAT_POLICIES = {
    None: None,
    "nothing": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def remat_critic(critic, remat=None):
    """``critic`` under ``jax.checkpoint`` with the named policy (``None`` returns it unchanged)."""
    if remat not in REMAT_POLICIES:
        raise ValueError(f"unknown remat policy {remat!r}; expected one of "
                         f"{tuple(REMAT_POLICIES)}")
    if remat is None:
        return critic
    return jax.checkpoint(critic, policy=REMAT_POLICIES[remat])


def _forward_over_reverse(critic, x, kind, target, weight, backend, axis_name):
    _, grads = penalty.input_gradients(critic, x)
    grads = lax.stop_gradient(grads)
    (value, norms), v = jax.value_and_grad(
        lambda g: penalty.penalty_and_norms_from_grads(
            g, kind=kind, target=target, weight=weight, backend=backend, axis_name=axis_name),
        has_aux=True)(grads)
    v = lax.stop_gradient(v)
    scores, tangent = jax.jvp(critic, (x,), (v,))
    del scores
    surrogate = jnp.sum(tangent, dtype=jnp.float32)
    if axis_name is not None:
        surrogate = lax.psum(surrogate, axis_name)
    return lax.stop_gradient(value) + (surrogate - lax.stop_gradient(surrogate)), norms


def gradient_penalty(critic, x, *, kind="wgan-gp", target=1.0, weight=10.0, backend="auto",
                     axis_name=None, second_order="reverse", remat=None):
    """:func:`fastgp.penalty.gradient_penalty` with a choice of second-order strategy and remat.

    Same arguments and value as :func:`fastgp.penalty.gradient_penalty`, plus ``second_order``
    (``"reverse"`` or ``"forward"``) and ``remat`` (``None``, ``"nothing"`` or ``"dots"``); see
    the module docstring.
    """
    value, _ = gradient_penalty_and_norms(
        critic, x, kind=kind, target=target, weight=weight, backend=backend,
        axis_name=axis_name, second_order=second_order, remat=remat)
    return value


def gradient_penalty_and_norms(critic, x, *, kind="wgan-gp", target=1.0, weight=10.0,
                               backend="auto", axis_name=None, second_order="reverse",
                               remat=None):
    """:func:`gradient_penalty`, also returning the (B_local,) float32 input-gradient norms."""
    if second_order not in SECOND_ORDER:
        raise ValueError(f"unknown second_order {second_order!r}; expected one of {SECOND_ORDER}")
    checks.check_kind(kind)
    checks.check_backend(backend)
    target = checks.check_target(target)
    weight = checks.check_weight(weight)
    critic = remat_critic(critic, remat)
    if second_order == "forward":
        return _forward_over_reverse(critic, x, kind, target, weight, backend, axis_name)
    return penalty.gradient_penalty_and_norms(critic, x, kind=kind, target=target, weight=weight,
                                              backend=backend, axis_name=axis_name)


__all__ = ["REMAT_POLICIES", "SECOND_ORDER", "gradient_penalty", "gradient_penalty_and_norms",
           "remat_critic"]
