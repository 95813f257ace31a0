"""Penalty forward+backward on precomputed input-gradients: value_and_grad of the penalty wrt g.

Groups ``penalty:<dtype>:<B>x<D>`` compare the naive jnp oracle with fastgp's XLA backend, timed
interleaved (``conftest.paired``; each sample repeats a blocking call enough times to take ~10 ms,
and the report divides by the repeat count). Pallas
interpret mode runs only as a smoke test (group ``smoke:interpret``), never as a speed claim.
"""

import jax
import jax.numpy as jnp
import pytest

from benchmarks import workloads as W

SHAPES = [(64, 2), (256, 2), (256, 3072), (64, 3 * 64 * 64), (256, 3 * 64 * 64)]
DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16}


def gradients(shape, dtype):
    return jax.random.normal(jax.random.PRNGKey(0), shape, jnp.float32).astype(dtype)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_penalty_value_and_grad(paired, shape, dtype):
    g = gradients(shape, DTYPES[dtype])
    paths = {}
    for path in ("naive", "xla"):
        fn = jax.jit(W.penalty_vjp(path))
        paths[path] = lambda fn=fn: jax.block_until_ready(fn(g))
    paired(
        paths,
        group=f"penalty:{dtype}:{shape[0]}x{shape[1]}",
        baseline="naive",
        rounds=15,
        calls="auto",
        batch=shape[0],
        features=shape[1],
    )


def test_penalty_interpret_smoke(bench):
    g = gradients((64, 2), jnp.float32)
    value, grad = bench(
        jax.jit(W.penalty_vjp("interpret")), g, group="smoke:interpret", path="interpret", rounds=3
    )
    ref_value, ref_grad = W.penalty_vjp("naive")(g)
    assert jnp.allclose(value, ref_value, rtol=1e-5)
    assert jnp.allclose(grad, ref_grad, rtol=1e-4, atol=1e-7)
