"""On a CUDA device only: the GPU kernels (Triton, and Mosaic GPU where the JAX and the GPU run
it) run natively and match float64; the penalty through the GPU kernel matches the naive path."""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastgp import penalty
from fastgp._gpu import pallas as pallas_gpu
from fastgp._gpu import tuned as gpu_tuned
from fastgp._penalty import reference
from fastgp.kernels.penalty import spans

pytestmark = pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a CUDA GPU")
KERNELS = {
    "triton": "fastgp.kernels.penalty.gpu",
    "mosaic_gpu": "fastgp.kernels.penalty.mosaic_gpu",
}


def _runs(kernel):
    if kernel == "triton":
        return pallas_gpu.has_triton()
    return pallas_gpu.mosaic_gpu_runs(jax.devices()[0])  # beside Triton too: checked natively


@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("batch,features", [(1, 1), (7, 300), (256, 3 * 64 * 64), (3, 1 << 18)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_native_gpu_sums_match_float64(kernel, batch, features, dtype):
    """One program a row, and the rows split over this GPU's programs."""
    if not _runs(kernel):
        pytest.skip(f"the {kernel} kernel does not run under this JAX on this GPU")
    module = importlib.import_module(KERNELS[kernel])
    g = jnp.asarray(np.random.default_rng(0).standard_normal((batch, features)), dtype)
    g64 = np.asarray(g.astype(jnp.float32), np.float64)
    split = spans.splits(batch, features, g.dtype.itemsize, gpu_tuned.penalty_programs())
    for sums in (module.row_sumsq(g), module.row_sumsq(g, split=split)):
        np.testing.assert_allclose(np.asarray(sums), np.sum(g64**2, axis=1), rtol=1e-5)


@pytest.mark.parametrize("backend", ["pallas", "auto"])
def test_native_gpu_second_order_matches_naive(backend):
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(0), 3)
    params = {"w": jax.random.normal(k1, (300, 16)) * 0.1, "v": jax.random.normal(k2, (16,))}
    x = jax.random.normal(k3, (33, 3, 100))
    critic = lambda p, y: jnp.tanh(y.reshape(y.shape[0], -1) @ p["w"]) @ p["v"]
    ours = jax.jit(
        jax.value_and_grad(
            lambda p: penalty.gradient_penalty(lambda y: critic(p, y), x, backend=backend)
        )
    )(params)
    naive = jax.value_and_grad(
        lambda p: reference.naive_gradient_penalty(lambda y: critic(p, y), x)
    )(params)
    np.testing.assert_allclose(ours[0], naive[0], rtol=1e-4)
    for name in params:
        np.testing.assert_allclose(
            ours[1][name],
            naive[1][name],
            rtol=1e-3,
            atol=1e-5 * float(jnp.max(jnp.abs(naive[1][name]))),
        )
