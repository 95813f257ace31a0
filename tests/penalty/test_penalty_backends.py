"""Every backend of the penalty equals the naive penalty: one case set over the op's backends.

The backends are the op's own list, ``fastgp._backends.OP_BACKENDS["penalty"]``, less
``"pallas"``, which needs a TPU or a GPU (tests/penalty/test_aot.py and test_gpu_kernels.py
compile it for them). Each case compares the value, the parameter gradients and a
Hessian-vector product in the parameters (``jax.jvp`` of ``jax.grad``) with nested ``jax.grad``
of ``fastgp.naive_gradient_penalty``, each side compiled as one program: every kind on a pytree
input whose leaves have a feature count off the kernels' tiles, and an image-shaped input.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fastgp
from fastgp._backends import OP_BACKENDS

RTOL = 1e-5  # of the largest |entry| of each reference result
BACKENDS = [b for b in OP_BACKENDS["penalty"] if b != "pallas"]
INPUTS: dict[str, list[tuple[int, ...]]] = {
    "pytree": [(6, 3, 5), (6, 130)],  # two leaves, 145 features in all
    "image": [(4, 8, 8, 3)],  # one NHWC leaf, 192 features
}
CASES = [("pytree", kind) for kind in ("wgan-gp", "wgan-lp", "r1")] + [("image", "wgan-gp")]


def critic(params, x):
    """Per-sample tanh MLP on the concatenated (B, ...) leaves of ``x``."""
    leaves = jax.tree.leaves(x)
    flat = jnp.concatenate([leaf.reshape(leaf.shape[0], -1) for leaf in leaves], axis=1)
    return (jnp.tanh(flat @ params["w1"] + params["b1"]) @ params["w2"])[:, 0]


def problem(name):
    shapes = INPUTS[name]
    keys = jax.random.split(jax.random.PRNGKey(0), len(shapes) + 4)
    x = {f"x{i}": jax.random.normal(keys[i], shape) for i, shape in enumerate(shapes)}
    features = sum(int(np.prod(shape[1:])) for shape in shapes)
    params = {
        "w1": 3.0 * jax.random.normal(keys[-4], (features, 16)) / np.sqrt(features),
        "b1": 0.1 * jax.random.normal(keys[-3], (16,)),
        "w2": jax.random.normal(keys[-2], (16, 1)),
    }
    leaves, tree = jax.tree.flatten(params)
    tangent_keys = jax.random.split(keys[-1], len(leaves))
    tangent = jax.tree.unflatten(
        tree, [jax.random.normal(k, p.shape) for k, p in zip(tangent_keys, leaves, strict=True)]
    )
    return params, x, tangent


@functools.partial(jax.jit, static_argnums=0)
def derivatives(penalty_fn, params, x, tangent):
    """The penalty, its parameter gradients and a Hessian-vector product, as one program."""
    loss = lambda p: penalty_fn(functools.partial(critic, p), x)
    grad = jax.grad(loss)
    return {
        "value": loss(params),
        "gradient": grad(params),
        "hvp": jax.jvp(grad, (params,), (tangent,))[1],
    }


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("inputs", "kind"), CASES, ids=[f"{i}-{k}" for i, k in CASES])
def test_value_gradients_and_hvp_equal_the_naive_penalty(backend, inputs, kind):
    params, x, tangent = problem(inputs)
    ours = functools.partial(fastgp.gradient_penalty, kind=kind, target=1.5, backend=backend)
    naive = functools.partial(fastgp.naive_gradient_penalty, kind=kind, target=1.5)
    got, want = derivatives(ours, params, x, tangent), derivatives(naive, params, x, tangent)
    for name in want:
        for g, w in zip(jax.tree.leaves(got[name]), jax.tree.leaves(want[name]), strict=True):
            g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
            scale = float(np.max(np.abs(w)))
            assert scale > 0, f"{name}: the reference is all zero, nothing is compared"
            np.testing.assert_allclose(g, w, rtol=0, atol=RTOL * scale, err_msg=name)
