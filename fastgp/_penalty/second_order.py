"""Reverse-over-forward second order: the penalty as a ``custom_vjp`` whose backward is a JVP's VJP.

For a critic D(x; θ) with input-gradient g = ∇_x Σ_b D(x)_b, a penalty P(g), and v = ∂P/∂g
(a per-sample rescaling of g), the chain rule gives

    ∂P/∂(x, θ) = (∂g/∂(x, θ))ᵀ v = ∇_(x, θ) ⟨∇_x Σ_b D(x), v⟩ = ∇_(x, θ) Σ_b jvp(D, x, v)_b

with v held fixed for that backward. A JVP followed by a VJP is far cheaper than a VJP of a VJP
for convolutions (no transposed convolution of a transposed convolution). The critic's traced
closed-over values (its parameters) are hoisted by ``jax.closure_convert`` so they are explicit
differentiable inputs. v keeps its dependence on θ and x through the saved g and norms, so outer
derivatives (Hessian-vector products, third order) differentiate the backward itself and stay
those of the penalty. Forward-mode autodiff of the penalty itself is not available (a custom_vjp
has no JVP rule); :func:`mean_penalty_and_norms` says so by name.
"""

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from fastgp._critic_ops import naming_first_order_only_ops
from fastgp._penalty import validation
from fastgp._penalty.gradients import input_gradients
from fastgp._penalty.rowops import RowOptions, norms_and_penalties, row_scale
from fastgp._typing import AxisName, Critic, PyTree
from fastgp.distributed import global_count, global_mean

Converted = Callable[..., jax.Array]  # the closure-converted critic: (x, *consts) -> scores
Consts = tuple[jax.Array, ...]  # the critic's hoisted closed-over values (its parameters)
Residuals = tuple[PyTree, Consts, PyTree, jax.Array]  # x, consts, grads, norms


def mean_penalty_and_norms(
    critic: Critic, x: PyTree, options: RowOptions, axis_name: AxisName
) -> tuple[jax.Array, jax.Array]:
    """(mean_b p(n_b) over the global batch, (B_local,) norms), differentiated reverse-over-forward.

    Args:
      critic: x -> scores (B,) or (B, 1); may close over traced values (its parameters).
      x: array or pytree of (B, ...) float arrays.
      options: the kind, target, backend and sample axes of the per-sample penalty (validated).
      axis_name: the mesh axes that split the batch, as in ``fastgp.penalty.gradient_penalty``.

    Returns:
      (scalar, (B_local,)) float32 (float64 for float64 input).
    """
    # A fresh lambda: closure_convert caches on its argument's hash, and many critics (Equinox
    # modules, dataclasses holding arrays) are not hashable.
    converted, consts = jax.closure_convert(lambda y: validation.call_critic(critic, y), x)
    try:
        penalty = _Penalty(converted, options, axis_name)
        return _mean_penalty(penalty, x, tuple(consts))
    except TypeError as err:
        if "forward-mode" not in str(err):
            raise
        raise TypeError(
            "fastgp.gradient_penalty with second_order='reverse-over-forward' is a custom_vjp and "
            "cannot be differentiated in forward mode first (jax.jvp or jax.jacfwd of the penalty "
            "itself). Take reverse mode first: jax.grad, and on top of it jax.jvp(jax.grad(f)), "
            "jax.hessian or further jax.grad all work; or use second_order='reverse', which is "
            "forward-differentiable."
        ) from err


@dataclasses.dataclass(frozen=True)
class _Penalty:
    """The penalty's static part: the closure-converted critic and the penalty's options."""

    converted: Converted
    options: RowOptions
    axis_name: AxisName

    def forward(self, x: PyTree, consts: Consts) -> tuple[jax.Array, jax.Array, PyTree]:
        """(mean penalty over the global batch, (B_local,) norms, input-gradients) at x."""
        _, grads = input_gradients(
            lambda y: self.converted(y, *consts),
            x,
            axis_name=self.axis_name,
            sample_axis_name=self.options.sample_axes,
        )
        leaves, _ = validation.leaves_of(grads, "grads")
        norms, penalties = norms_and_penalties(leaves, self.options)
        return global_mean(penalties, self.axis_name), norms, grads


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _mean_penalty(penalty: _Penalty, x: PyTree, consts: Consts) -> tuple[jax.Array, jax.Array]:
    mean, norms, _ = penalty.forward(x, consts)
    return mean, norms


def _mean_penalty_fwd(
    penalty: _Penalty, x: PyTree, consts: Consts
) -> tuple[tuple[jax.Array, jax.Array], Residuals]:
    mean, norms, grads = penalty.forward(x, consts)
    return (mean, norms), (x, consts, grads, norms)


def _scale_like(scale: jax.Array, tree: PyTree) -> PyTree:
    """``scale[b] * leaf[b]`` for every (B, ...) leaf of ``tree``, computed in float32 (or wider),
    returned in each leaf's dtype. Left to XLA, which fuses it into the JVP that consumes it."""

    def scaled(leaf: jax.Array) -> jax.Array:
        dtype = jnp.promote_types(leaf.dtype, scale.dtype)
        factor = scale.astype(dtype).reshape((-1,) + (1,) * (leaf.ndim - 1))
        return (factor * leaf.astype(dtype)).astype(leaf.dtype)

    return jax.tree.map(scaled, tree)


def _differentiable(value: Any) -> bool:
    return jnp.issubdtype(jnp.result_type(value), jnp.inexact)


def _zero_cotangent(value: Any) -> jax.Array:
    """The cotangent of a non-differentiable input (integer arrays, keys): float0 zeros."""
    return jnp.zeros(jnp.shape(value), jax.dtypes.float0)


def _mean_penalty_bwd(
    penalty: _Penalty, residuals: Residuals, cotangents: tuple[jax.Array, jax.Array]
) -> tuple[PyTree, Consts]:
    x, consts, grads, norms = residuals
    ct_mean, ct_norms = cotangents
    ct_penalty = ct_mean / global_count(norms.shape[0], penalty.axis_name).astype(norms.dtype)
    v = _scale_like(
        row_scale(norms, ct_norms, ct_penalty, penalty.options.kind, penalty.options.target), grads
    )

    where = tuple(_differentiable(c) for c in consts)
    live = tuple(c for c, d in zip(consts, where, strict=True) if d)

    def directional(x: PyTree, live: Consts) -> jax.Array:
        it = iter(live)
        full = tuple(next(it) if d else c for c, d in zip(consts, where, strict=True))
        _, tangent = jax.jvp(lambda y: penalty.converted(y, *full), (x,), (v,))
        return jnp.sum(tangent, dtype=jnp.promote_types(tangent.dtype, jnp.float32))

    with naming_first_order_only_ops("reverse-over-forward"):
        ct_x, ct_live = jax.grad(directional, argnums=(0, 1))(x, live)
    it = iter(ct_live)
    ct_consts = tuple(
        next(it) if d else _zero_cotangent(c) for c, d in zip(consts, where, strict=True)
    )
    return ct_x, ct_consts


_mean_penalty.defvjp(_mean_penalty_fwd, _mean_penalty_bwd)


__all__ = ["mean_penalty_and_norms"]
