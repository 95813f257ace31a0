"""Independent oracles: float64 numpy norms and penalties per sample, JAX's own derivatives of a
loss in its parameters, and the float64 truth that exactness is asserted against.

Exactness (a derivative equals nested autodiff, a layout equals one device) is asserted in
float64 (``jax.enable_x64(True)`` around the test, the float32 data cast with :func:`to64`), at
bounds float64's rounding sets; float32 is the subject only where float32 is what is tested (a
kernel's float32 accumulation, bf16 inputs), at bounds that say why. ``fastgp.attention`` and
``fastgp.naive_attention`` accumulate in float32 whatever their inputs' dtype, so a float64
critic around them rounds in the attention alone; :func:`attention64` is attention in float64.
"""

import jax
import jax.numpy as jnp
import numpy as np


def value_grad_hvp(loss, params, tangent):
    """``loss(params)``, its gradient and its Hessian-vector product along ``tangent``, from one
    ``jax.jvp`` of ``jax.value_and_grad`` (whose primal is the value and gradient)."""
    (value, grads), (_, hvp) = jax.jvp(jax.value_and_grad(loss), (params,), (tangent,))
    return value, grads, hvp


def to64(tree):
    """Every floating leaf of ``tree`` as float64, the same values (float32 -> float64 is exact);
    call under ``jax.enable_x64(True)``, which float64 arrays need."""
    assert jax.dtypes.canonicalize_dtype(jnp.float64) == jnp.float64, "to64 needs x64 enabled"
    return jax.tree.map(
        lambda a: jnp.asarray(a, jnp.float64) if jnp.issubdtype(a.dtype, jnp.floating) else a,
        tree,
    )


def attention64(q, k, v, *, mask=None, is_causal=False, scale=None):
    """``fastgp.naive_attention`` in the inputs' own dtype (float64 under x64), where that casts
    to float32: (B, Tq, H, Dv) softmax(scale q kᵀ) v, ``mask`` (B, Tk) True to attend,
    ``is_causal`` query i sees keys j <= i, a query with no key gives zeros."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    s = scale * jnp.einsum("bqhd,bkhd->bhqk", q, k)
    valid = jnp.ones(s.shape, bool)
    if mask is not None:
        valid = valid & mask[:, None, None, :]
    if is_causal:
        valid = valid & jnp.tril(jnp.ones(s.shape[-2:], bool))
    seen = jnp.any(valid, axis=-1, keepdims=True)
    m = jax.lax.stop_gradient(jnp.max(jnp.where(valid, s, -jnp.inf), axis=-1, keepdims=True))
    e = jnp.where(valid, jnp.exp(jnp.where(valid, s - jnp.where(seen, m, 0.0), 0.0)), 0.0)
    p = e / jnp.where(seen, jnp.sum(e, axis=-1, keepdims=True), 1.0)
    return jnp.einsum("bhqk,bkhd->bqhd", p, v)


def rows64(tree_leaves):
    """Concatenate leaves (B, ...) into one (B, D) float64 array."""
    batch = tree_leaves[0].shape[0]
    return np.concatenate(
        [np.asarray(leaf, np.float64).reshape(batch, -1) for leaf in tree_leaves], axis=1
    )


def norms64(tree_leaves):
    return np.sqrt(np.sum(rows64(tree_leaves) ** 2, axis=1))


def penalties64(norms, kind, target):
    if kind == "wgan-gp":
        return (norms / target - 1.0) ** 2
    if kind == "wgan-lp":
        return np.maximum(0.0, norms / target - 1.0) ** 2
    if kind == "r1":
        return norms**2
    raise ValueError(kind)
