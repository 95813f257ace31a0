"""Public gradient-penalty API: one surface for the penalty, its gradients and its diagnostics.

    gradient_penalty(critic, x, *, kind, target, weight, ...)   -> scalar
    penalty_from_grads(grads, *, kind, target, weight, ...)     -> scalar
    grad_norms(grads)                                           -> (B,) per-sample L2 norms
    interpolate(key, real, fake)                                -> x_hat, alpha ~ U[0, 1] per sample

``grads`` and ``x`` are arrays or pytrees of arrays sharing a leading batch axis B. Norms always
accumulate in float32 (float64 for float64 input with x64 enabled), whatever the input dtype, and
results are float32 (float64). Inside ``shard_map`` pass ``axis_name`` (the data axis) for the mean
over the global batch; forgetting it on sharded data is an error. See the README for the maths.
"""

import inspect
from collections.abc import Callable
from typing import ParamSpec, get_args

import jax
import jax.numpy as jnp

from fastgp._critic_ops import naming_first_order_only_ops
from fastgp._penalty import validation
from fastgp._penalty.rowops import norms_and_penalties
from fastgp._penalty.second_order import mean_penalty_and_norms
from fastgp._typing import AxisName, Backend, Critic, Kind, PyTree, Remat, SecondOrder
from fastgp.distributed import global_batch_slice, global_mean, require_axis_name, shard_count

P = ParamSpec("P")
DEFAULT_WEIGHT = 10.0  # lambda of Gulrajani et al. (2017), used by every function here
SECOND_ORDER: tuple[SecondOrder, ...] = get_args(SecondOrder)
# None and every RematPolicy (tests/test_penalty.py holds the keys to the type).
REMAT_POLICIES: dict[Remat, Callable[..., bool] | None] = {
    None: None,
    "nothing": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def _penalty_alone(
    with_norms: Callable[P, tuple[jax.Array, jax.Array]], name: str, doc: str
) -> Callable[P, jax.Array]:
    """The function ``name`` that returns the penalty of ``with_norms(...) -> (penalty, norms)``.

    It takes ``with_norms``'s parameters, as its signature says, and has the docstring ``doc``.
    """

    def penalty(*args: P.args, **kwargs: P.kwargs) -> jax.Array:
        value, _ = with_norms(*args, **kwargs)
        return value

    penalty.__name__ = penalty.__qualname__ = name
    penalty.__doc__ = doc
    signature = inspect.signature(with_norms).replace(return_annotation=jax.Array)
    penalty.__signature__ = signature  # type: ignore[attr-defined]
    return penalty


def per_sample_penalties(
    grads: PyTree, *, kind: Kind = "wgan-gp", target: float = 1.0, backend: Backend = "auto"
) -> tuple[jax.Array, jax.Array]:
    """(norms, penalties), each (B,) float32, for a pytree of (B, ...) input-gradients."""
    validation.check_kind(kind)
    validation.check_backend(backend)
    target = validation.check_target(target)
    leaves, _ = validation.leaves_of(grads, "grads")
    validation.check_backend_on_data(backend, grads)
    return norms_and_penalties(leaves, kind, target, backend)


def grad_norms(grads: PyTree, *, backend: Backend = "auto") -> jax.Array:
    """(B,) float32 L2 norm of each sample's gradient over every leaf and non-batch element."""
    norms, _ = per_sample_penalties(grads, kind="r1", backend=backend)
    return norms


def penalty_and_norms_from_grads(
    grads: PyTree,
    *,
    kind: Kind = "wgan-gp",
    target: float = 1.0,
    weight: float | jax.Array = DEFAULT_WEIGHT,
    backend: Backend = "auto",
    axis_name: AxisName = None,
) -> tuple[jax.Array, jax.Array]:
    """(``weight * mean_b p(n_b)`` over the global batch, (B_local,) float32 norms)."""
    weight = validation.check_weight(weight)
    validation.check_axis_name(axis_name)
    require_axis_name(grads, axis_name, "grads")
    norms, penalties = per_sample_penalties(grads, kind=kind, target=target, backend=backend)
    return weight * global_mean(penalties, axis_name), norms


penalty_from_grads = _penalty_alone(
    penalty_and_norms_from_grads,
    "penalty_from_grads",
    """``weight * mean_b p(n_b)`` over the global batch, for input-gradients already computed.

    Differentiable in ``grads`` to any order (the kernels' nested custom VJPs).
    """,
)


def input_gradients(critic: Critic, x: PyTree) -> tuple[jax.Array, PyTree]:
    """(scores (B,), d sum(scores) / dx) for a per-sample critic; gradients share x's structure."""
    _, batch = validation.leaves_of(x, "x")
    scores, pullback = jax.vjp(lambda y: validation.call_critic(critic, y), x)
    flat = validation.check_scores(scores, batch)
    (grads,) = pullback(jnp.ones_like(scores))
    return flat, grads


def remat_critic(critic: Critic, remat: Remat = None) -> Critic:
    """``critic`` under ``jax.checkpoint`` with the named policy (``None`` returns it unchanged)."""
    validation.check_choice("remat", remat, tuple(REMAT_POLICIES))
    if remat is None:
        return critic
    return jax.checkpoint(critic, policy=REMAT_POLICIES[remat])


def gradient_penalty_and_norms(
    critic: Critic,
    x: PyTree,
    *,
    kind: Kind = "wgan-gp",
    target: float = 1.0,
    weight: float | jax.Array = DEFAULT_WEIGHT,
    backend: Backend = "auto",
    axis_name: AxisName = None,
    second_order: SecondOrder = "reverse-over-forward",
    remat: Remat = None,
) -> tuple[jax.Array, jax.Array]:
    """Like :func:`gradient_penalty`, also returning the (B_local,) float32 input-gradient norms."""
    validation.check_kind(kind)
    validation.check_backend(backend)
    validation.check_axis_name(axis_name)
    validation.check_choice("second_order", second_order, SECOND_ORDER)
    target = validation.check_target(target)
    weight = validation.check_weight(weight)
    validation.leaves_of(x, "x")
    require_axis_name(x, axis_name, "x")
    validation.check_backend_on_data(backend, x)
    critic = remat_critic(critic, remat)
    if second_order == "reverse":
        with naming_first_order_only_ops("reverse"):
            _, grads = input_gradients(critic, x)
        return penalty_and_norms_from_grads(
            grads, kind=kind, target=target, weight=weight, backend=backend, axis_name=axis_name
        )
    mean, norms = mean_penalty_and_norms(
        critic, x, kind=kind, target=target, backend=backend, axis_name=axis_name
    )
    return weight * mean, norms


gradient_penalty = _penalty_alone(
    gradient_penalty_and_norms,
    "gradient_penalty",
    """Gradient penalty ``weight * mean_b p(||∂D(x)_b / ∂x_b||)`` of ``critic`` at points ``x``.

    Args:
      critic: x -> scores of shape (B,) or (B, 1); must treat samples independently (no batch
        norm). Close over its parameters: ``jax.grad`` of this with respect to them is the
        second-order gradient.
      x: (B, ...) float array or pytree of them (f32, bf16, f16; f64 with x64 on ``"xla"``).
      kind: ``"wgan-gp"`` (two-sided), ``"wgan-lp"`` (one-sided) or ``"r1"`` (zero-centred).
      target: relative target norm t (static, > 0); ``kind="r1"`` ignores it.
      weight: lambda (may be traced, e.g. a schedule); 10 by default.
      backend: ``"auto"``, ``"pallas"``, ``"interpret"``, ``"tpu-interpret"``,
        ``"gpu-interpret"`` or ``"xla"`` (see ``fastgp._penalty.binding``).
      axis_name: inside ``shard_map``, the data axis: the mean is then over the global batch;
        ``()`` for a deliberate per-shard mean.
      second_order: ``"reverse-over-forward"`` (default; a custom_vjp whose backward is the VJP of
        a JVP of the critic, exact to every order) or ``"reverse"`` (nested reverse mode).
      remat: ``None``, ``"nothing"`` or ``"dots"``: rematerialise the critic's activations.

    Returns:
      scalar float32 (float64 for float64 input).
    """,
)


def interpolate(
    key: jax.Array, real: PyTree, fake: PyTree, *, axis_name: AxisName = None
) -> PyTree:
    """``real + alpha * (fake - real)`` with one alpha ~ U[0, 1] per sample, shared by all leaves.

    Inside ``shard_map`` pass ``axis_name``: alpha is then drawn for the global batch and each
    shard takes its own slice, so the result equals the single-device one for the same key.
    ``axis_name=()`` draws alpha per shard from ``key`` as given.
    """
    validation.check_same_structure(real, fake)
    validation.check_axis_name(axis_name)
    _, batch = validation.leaves_of(real, "real")
    require_axis_name(
        (real, fake),
        axis_name,
        "real/fake",
        "every shard would draw the same alphas from the same key",
    )
    shards = shard_count(axis_name)
    alpha = jax.random.uniform(key, (batch * shards,), jnp.float32)
    if shards != 1:
        alpha = global_batch_slice(alpha, batch, axis_name)

    def mix(r: jax.Array, f: jax.Array) -> jax.Array:
        a = alpha.reshape((batch,) + (1,) * (r.ndim - 1)).astype(r.dtype)
        return r + a * (f - r)

    return jax.tree.map(mix, real, fake)


__all__ = [
    "DEFAULT_WEIGHT",
    "REMAT_POLICIES",
    "SECOND_ORDER",
    "grad_norms",
    "gradient_penalty",
    "gradient_penalty_and_norms",
    "input_gradients",
    "interpolate",
    "penalty_and_norms_from_grads",
    "penalty_from_grads",
    "per_sample_penalties",
    "remat_critic",
]
