"""Public gradient-penalty API: one surface for the penalty, its gradients and its diagnostics.

    gradient_penalty(critic, x, *, kind, target, weight, ...)   -> scalar
    penalty_from_grads(grads, *, kind, target, weight, ...)     -> scalar
    grad_norms(grads)                                           -> (B,) per-sample L2 norms
    interpolate(key, real, fake)                                -> x_hat, alpha ~ U[0, 1] per sample

``grads`` and ``x`` are arrays or pytrees of arrays sharing a leading batch axis B. Norms always
accumulate in float32 (float64 for float64 input with x64 enabled), whatever the input dtype, and
results are float32 (float64). Inside ``shard_map`` name every mesh axis the data varies over:
``axis_name`` for the axes that split the batch (the mean is over the global batch) and
``sample_axis_name`` for those that split each sample (its norm sums over them); an unnamed axis
is an error. See the README for the maths.
"""

from collections.abc import Callable
from typing import get_args

import jax
import jax.numpy as jnp

from fastgp._critic_ops import naming_first_order_only_ops
from fastgp._penalty import validation
from fastgp._penalty.gradients import input_gradients
from fastgp._penalty.kinds import DEFAULT_WEIGHT
from fastgp._penalty.rowops import RowOptions, norms_and_penalties
from fastgp._penalty.second_order import mean_penalty_and_norms
from fastgp._typing import AxisName, Backend, Critic, Kind, PyTree, Remat, SecondOrder
from fastgp.distributed import (
    collective_axes,
    global_batch_slice,
    global_mean,
    shard_count,
    varying_axes,
)

SECOND_ORDER: tuple[SecondOrder, ...] = get_args(SecondOrder)
# None and every RematPolicy (tests/penalty/test_penalty.py holds the keys to the type).
REMAT_POLICIES: dict[Remat, Callable[..., bool] | None] = {
    None: None,
    "nothing": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def per_sample_penalties(
    grads: PyTree,
    *,
    kind: Kind = "wgan-gp",
    target: float = 1.0,
    backend: Backend = "auto",
    sample_axis_name: AxisName = None,
) -> tuple[jax.Array, jax.Array]:
    """(norms, penalties), each (B,) float32, for a pytree of (B, ...) input-gradients; inside
    ``shard_map``, ``sample_axis_name`` names the mesh axes that split each sample (the norms
    are then whole-sample norms, equal on every slice)."""
    validation.check_kind(kind)
    validation.check_backend(backend)
    validation.check_axis_name(sample_axis_name, "sample_axis_name")
    target = validation.check_target(target)
    leaves, _ = validation.leaves_of(grads, "grads")
    validation.check_backend_on_data(backend, grads)
    options = RowOptions(kind, target, backend, collective_axes(sample_axis_name))
    return norms_and_penalties(leaves, options)


def grad_norms(
    grads: PyTree, *, backend: Backend = "auto", sample_axis_name: AxisName = None
) -> jax.Array:
    """(B,) float32 L2 norm of each sample's gradient over every leaf and non-batch element (and,
    inside ``shard_map``, over the slices of ``sample_axis_name``)."""
    norms, _ = per_sample_penalties(
        grads, kind="r1", backend=backend, sample_axis_name=sample_axis_name
    )
    return norms


def penalty_and_norms_from_grads(
    grads: PyTree,
    *,
    kind: Kind = "wgan-gp",
    target: float = 1.0,
    weight: float | jax.Array = DEFAULT_WEIGHT,
    backend: Backend = "auto",
    axis_name: AxisName = None,
    sample_axis_name: AxisName = None,
) -> tuple[jax.Array, jax.Array]:
    """(``weight * mean_b p(n_b)`` over the global batch, (B_local,) float32 norms)."""
    weight = validation.check_weight(weight)
    validation.check_mesh_axes(grads, "grads", axis_name, sample_axis_name)
    norms, penalties = per_sample_penalties(
        grads, kind=kind, target=target, backend=backend, sample_axis_name=sample_axis_name
    )
    return weight * global_mean(penalties, axis_name), norms


def penalty_from_grads(
    grads: PyTree,
    *,
    kind: Kind = "wgan-gp",
    target: float = 1.0,
    weight: float | jax.Array = DEFAULT_WEIGHT,
    backend: Backend = "auto",
    axis_name: AxisName = None,
    sample_axis_name: AxisName = None,
) -> jax.Array:
    """``weight * mean_b p(n_b)`` over the global batch, for input-gradients already computed.

    Differentiable in ``grads`` to any order (the kernels' nested custom VJPs).
    """
    value, _ = penalty_and_norms_from_grads(
        grads,
        kind=kind,
        target=target,
        weight=weight,
        backend=backend,
        axis_name=axis_name,
        sample_axis_name=sample_axis_name,
    )
    return value


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
    sample_axis_name: AxisName = None,
    second_order: SecondOrder = "reverse-over-forward",
    remat: Remat = None,
) -> tuple[jax.Array, jax.Array]:
    """Like :func:`gradient_penalty`, also returning the (B_local,) float32 input-gradient norms."""
    validation.check_kind(kind)
    validation.check_backend(backend)
    validation.check_choice("second_order", second_order, SECOND_ORDER)
    target = validation.check_target(target)
    weight = validation.check_weight(weight)
    validation.leaves_of(x, "x")
    validation.check_mesh_axes(x, "x", axis_name, sample_axis_name)
    validation.check_backend_on_data(backend, x)
    critic = remat_critic(critic, remat)
    options = RowOptions(kind, target, backend, collective_axes(sample_axis_name))
    if second_order == "reverse":
        with naming_first_order_only_ops("reverse"):
            _, grads = input_gradients(
                critic, x, axis_name=axis_name, sample_axis_name=sample_axis_name
            )
        leaves, _ = validation.leaves_of(grads, "grads")
        norms, penalties = norms_and_penalties(leaves, options)
        return weight * global_mean(penalties, axis_name), norms
    mean, norms = mean_penalty_and_norms(critic, x, options, axis_name)
    return weight * mean, norms


def gradient_penalty(
    critic: Critic,
    x: PyTree,
    *,
    kind: Kind = "wgan-gp",
    target: float = 1.0,
    weight: float | jax.Array = DEFAULT_WEIGHT,
    backend: Backend = "auto",
    axis_name: AxisName = None,
    sample_axis_name: AxisName = None,
    second_order: SecondOrder = "reverse-over-forward",
    remat: Remat = None,
) -> jax.Array:
    """Gradient penalty ``weight * mean_b p(||∂D(x)_b / ∂x_b||)`` of ``critic`` at points ``x``.

    Args:
      critic: x -> scores of shape (B,) or (B, 1); must treat samples independently (no batch
        norm). Close over its parameters: ``jax.grad`` of this with respect to them is the
        second-order gradient.
      x: (B, ...) float array or pytree of them (f32, bf16, f16; f64 with x64 on ``"xla"``).
      kind: ``"wgan-gp"`` (two-sided), ``"wgan-lp"`` (one-sided) or ``"r1"`` (zero-centred).
      target: relative target norm t (static, > 0); ``kind="r1"`` ignores it.
      weight: lambda (>= 0; may be traced, e.g. a schedule, and is then not checked); 10 by
        default.
      backend: ``"auto"``, ``"pallas"``, ``"interpret"``, ``"tpu-interpret"``,
        ``"gpu-interpret"`` or ``"xla"`` (see ``fastgp._penalty.binding``).
      axis_name: inside ``shard_map``, the mesh axes that split the batch: the mean is then over
        the global batch; ``()`` for a deliberate per-shard mean.
      sample_axis_name: inside ``shard_map``, the mesh axes that split each sample (its tokens,
        rows or features): each norm sums over them. The critic must then return whole-sample
        scores, equal on every slice (a psum over these axes inside it).
      second_order: ``"reverse-over-forward"`` (default; a custom_vjp whose backward is the VJP of
        a JVP of the critic, exact to every order) or ``"reverse"`` (nested reverse mode).
      remat: ``None``, ``"nothing"`` or ``"dots"``: rematerialise the critic's activations.

    Returns:
      scalar float32 (float64 for float64 input).
    """
    value, _ = gradient_penalty_and_norms(
        critic,
        x,
        kind=kind,
        target=target,
        weight=weight,
        backend=backend,
        axis_name=axis_name,
        sample_axis_name=sample_axis_name,
        second_order=second_order,
        remat=remat,
    )
    return value


def interpolate(
    key: jax.Array,
    real: PyTree,
    fake: PyTree,
    *,
    axis_name: AxisName = None,
    sample_axis_name: AxisName = None,
) -> PyTree:
    """``real + alpha * (fake - real)`` with one alpha ~ U[0, 1] per sample, shared by all leaves.

    Inside ``shard_map`` pass ``axis_name`` (the axes that split the batch): alpha is then drawn
    for the global batch and each shard takes its own slice, so the result equals the
    single-device one for the same key. Along ``sample_axis_name`` (axes that split each sample)
    every slice of a sample gets the same alpha (``key`` must be the same on them).
    ``axis_name=()`` draws alpha per shard from ``key`` as given.
    """
    validation.check_same_structure(real, fake)
    _, batch = validation.leaves_of(real, "real")
    validation.check_mesh_axes(
        (real, fake),
        "real/fake",
        axis_name,
        sample_axis_name,
        "every shard would draw the same alphas from the same key",
    )
    varying_key = set(varying_axes(key)) & set(collective_axes(sample_axis_name))
    if varying_key:
        raise ValueError(
            f"interpolate: key varies over the sample axes {tuple(sorted(varying_key))}, so the "
            f"slices of one sample would get different alphas; pass the same key on every slice"
        )
    shards = shard_count(axis_name)
    alpha = jax.random.uniform(key, (batch * shards,), jnp.float32)
    if shards != 1:
        alpha = global_batch_slice(alpha, batch, axis_name)

    def mix(r: jax.Array, f: jax.Array) -> jax.Array:
        a = alpha.reshape((batch,) + (1,) * (r.ndim - 1)).astype(r.dtype)
        return r + a * (f - r)

    return jax.tree.map(mix, real, fake)
