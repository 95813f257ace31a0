"""The finite-difference ("approximated") R1 penalty, taken with first-order autodiff only.

    approximate_r1(critic, x, key, *, sigma, weight, axis_name=None)
        = weight * mean_b (D(x_b + sigma * eps_b) - D(x_b))**2,   eps_b ~ N(0, I) of x_b's shape

For a twice-differentiable critic, with s = sigma, g_b = ∂D(x)_b / ∂x_b and H_b its Hessian,

    D(x_b + sε) - D(x_b) = s⟨g_b, ε⟩ + (s²/2) εᵀH_bε + O(s³),
    E_ε[(D(x_b + sε) - D(x_b))²] = s²‖g_b‖² + O(s⁴)

(the s³ terms are odd in ε and vanish in expectation), so the penalty estimates R1 (kind="r1"
of ``fastgp.gradient_penalty``) with weight ``weight * sigma**2``, plus an O(s⁴) bias and the
variance of one noise draw per sample. Taken at the fakes it is the approximated R2.

Its parameter gradient needs one ordinary backward pass through the critic (no JVP, no nested
gradient), so it runs on critics holding ops that only define a first-order ``custom_vjp``
(fused attention kernels, third-party Pallas kernels) where no exact penalty can be taken.
"""

import math
import numbers

import jax
import jax.numpy as jnp
from jax import lax

from fastgp import distributed
from fastgp._penalty import validation
from fastgp._sharding import collective_axis
from fastgp._typing import AxisName, Critic, PyTree


def check_sigma(sigma: float | jax.Array) -> float | jax.Array:
    """sigma may be traced (a schedule); a concrete one must be a finite real number > 0."""
    if isinstance(sigma, jax.core.Tracer):
        return sigma
    if isinstance(sigma, bool) or not (isinstance(sigma, numbers.Real) or hasattr(sigma, "dtype")):
        raise TypeError(f"sigma must be a real scalar, got {sigma!r}")
    try:
        value = float(sigma)
    except TypeError as err:
        raise TypeError(f"sigma must be a real scalar, got {sigma!r}") from err
    if not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"sigma must be finite and > 0, got {value}; it is the standard deviation of the "
            f"input noise (APT uses 0.01 for images, 0.1 for video)"
        )
    return sigma


def sample_keys(key: jax.Array, local_batch: int, axis_name: AxisName) -> jax.Array:
    """(B_local,) keys, one per sample: this shard's slice of ``split(key, global batch)``.

    The noise of a sample depends only on ``key`` and the sample's index in the global batch, so
    a sharded call equals the single-device call with the same key, and no shard materialises
    noise for samples other than its own."""
    shards = distributed.shard_count(axis_name)
    keys = jax.random.split(key, local_batch * shards)
    if shards != 1:
        keys = distributed.global_batch_slice(keys, local_batch, axis_name)
    return keys


def perturb(
    key: jax.Array,
    x: PyTree,
    sigma: float | jax.Array,
    axis_name: AxisName,
    sample_axis_name: AxisName = None,
) -> PyTree:
    """``x + sigma * eps`` with eps ~ N(0, I) of x's structure, drawn per sample (see
    :func:`sample_keys`), one independent stream per leaf; along ``sample_axis_name`` each slice
    of a sample draws its own part from the sample's key folded with the slice's index. The sum
    is formed in float32 (or wider) and returned in each leaf's dtype."""
    leaves, batch = validation.leaves_of(x, "x")
    treedef = jax.tree.structure(x)
    keys = sample_keys(key, batch, axis_name)
    sample_axes = distributed.collective_axes(sample_axis_name)
    if sample_axes:
        index = lax.axis_index(collective_axis(sample_axes))
        keys = jax.vmap(lambda k: jax.random.fold_in(k, index))(keys)

    def noise_of_sample(k: jax.Array) -> list[jax.Array]:
        leaf_keys = jax.random.split(k, len(leaves))
        return [
            jax.random.normal(leaf_keys[i], leaf.shape[1:], jnp.promote_types(leaf.dtype, "f4"))
            for i, leaf in enumerate(leaves)
        ]

    noises = jax.vmap(noise_of_sample)(keys)
    perturbed = []
    for leaf, eps in zip(leaves, noises, strict=True):
        wide = leaf.astype(eps.dtype) + jnp.asarray(sigma, eps.dtype) * eps
        perturbed.append(wide.astype(leaf.dtype))
    return jax.tree.unflatten(treedef, perturbed)


def _check_axes(x: PyTree, axis_name: AxisName, sample_axis_name: AxisName) -> int:
    """The local batch of x, once its mesh axes are named as the penalty's are."""
    _, batch = validation.leaves_of(x, "x")
    validation.check_mesh_axes(
        x,
        "x",
        axis_name,
        sample_axis_name,
        "every shard would draw the same noise from the same key and the mean would be over "
        "this shard only",
    )
    return batch


def approximate_r1(
    critic: Critic,
    x: PyTree,
    key: jax.Array,
    *,
    sigma: float | jax.Array,
    weight: float | jax.Array,
    axis_name: AxisName = None,
    sample_axis_name: AxisName = None,
) -> jax.Array:
    """Finite-difference R1 penalty ``weight * mean_b (D(x_b + sigma*eps_b) - D(x_b))**2``.

    It estimates ``weight * sigma**2 * mean_b ||∂D(x)_b/∂x_b||**2`` (bias O(sigma**4)): it is R1
    with an effective weight of about ``weight * sigma**2``, and at the fakes it is the
    approximated R2. APT (Seaweed, 2025) uses weight 100 with sigma 0.01 for images and 0.1 for
    video. Only first-order autodiff runs through the critic, so ``jax.grad`` with respect to
    what it closes over works on ops that have only a ``custom_vjp``.

    Args:
      critic: x -> scores of shape (B,) or (B, 1); must treat samples independently. Close over
        its parameters. Return float32 scores from a bf16 critic: the difference of two bf16
        scores keeps only their 8 mantissa bits.
      x: (B, ...) float array or pytree of them (f32, bf16, f16; f64 with x64), e.g. real data
        (R1) or fakes (R2).
      key: PRNG key for the noise; sample b's noise depends only on the key and b's index in the
        global batch, so the value under ``shard_map`` equals the single-device one.
      sigma: standard deviation of the noise (finite, > 0; may be traced). ``x + sigma * eps``
        is formed in float32 and cast to each leaf's dtype, so in bf16 it is rounded to bf16.
      weight: lambda (finite, >= 0; may be traced). Required, with no default: the R1 weight it
        stands for is ``weight * sigma**2``, so no single value fits every sigma.
      axis_name: inside ``shard_map``, the mesh axes that split the batch: noise is drawn per
        global sample and the mean is over the global batch; ``()`` for a per-shard value from
        ``key`` as given.
      sample_axis_name: inside ``shard_map``, the mesh axes that split each sample. The critic
        must return whole-sample scores on every slice (a psum over these axes inside it): the
        difference D(x + sigma eps) - D(x) is a sample's only once its score is whole, and only
        then is it squared. Each slice draws its own part of the noise (the sample's key folded
        with the slice's index), so the noise differs from one device's for the same key.

    Returns:
      scalar float32 (float64 for float64 scores): the differences and squares are taken in
      float32 even when the scores are bf16.
    """
    sigma = check_sigma(sigma)
    weight = validation.check_weight(weight)
    batch = _check_axes(x, axis_name, sample_axis_name)
    noisy = perturb(key, x, sigma, axis_name, sample_axis_name)

    def scores(points: PyTree) -> jax.Array:
        raw = validation.call_critic(critic, points)
        return validation.check_scores(raw, batch, x, axis_name, sample_axis_name)

    clean_scores, noisy_scores = scores(x), scores(noisy)
    dtype = jnp.promote_types(jnp.result_type(clean_scores, noisy_scores), jnp.float32)
    differences = noisy_scores.astype(dtype) - clean_scores.astype(dtype)
    return weight * distributed.global_mean(jnp.square(differences), axis_name)


__all__ = ["approximate_r1", "check_sigma", "perturb"]
