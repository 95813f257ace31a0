"""The penalty's Mosaic GPU kernel: GPU interpret mode against float64, and lowered for CUDA on
CPU for an abstract H100. Where this JAX lacks Mosaic GPU's public kernel API and interpret mode
(0.10.2), the module is skipped.

GPU interpret mode simulates the GPU's memory: a read past the leaf's end raises there, so the
ragged shapes also check that no window leaves the array. The whole penalty step through the
kernel is in tests/penalty/test_gpu_kernels.py (the ``mosaic_gpu`` cases)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fastgp._gpu import pallas as pallas_gpu
from fastgp._gpu.lowering import for_gpu
from fastgp.kernels.penalty import spans

if not pallas_gpu.has_mosaic_gpu():
    pytest.skip("this JAX has no public Mosaic GPU kernel API", allow_module_level=True)

from fastgp.kernels.penalty import mosaic_gpu  # needs the API probed above


@pytest.mark.parametrize("batch,features", [(1, 1), (3, 100), (9, 4097), (2, 70000)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("programs", [1, 5, 528])
def test_mosaic_gpu_kernel_matches_float64(batch, features, dtype, programs):
    """The Triton kernel's cases: one program a row, and rows split into spans (70,000 features
    are 17 chunks of 4,096 and a part); a leaf smaller than a chunk (1 and 300 elements), rows
    that start mid-chunk (4,097 features), and the last window shifted back from the end."""
    rng = np.random.default_rng(features)
    g = jnp.asarray(rng.standard_normal((batch, features)), dtype)
    g64 = np.asarray(g.astype(jnp.float32), np.float64)
    split = spans.splits(batch, features, g.dtype.itemsize, programs)
    sums = np.asarray(mosaic_gpu.row_sumsq(g, split=split, interpret=True))
    assert sums.dtype == np.float32 and sums.shape == (batch,)
    np.testing.assert_allclose(sums, np.sum(g64**2, axis=1), rtol=1e-6)


def test_one_program_a_row_by_default():
    g = jnp.asarray(np.random.default_rng(0).standard_normal((5, 9000)), jnp.bfloat16)
    g64 = np.asarray(g.astype(jnp.float32), np.float64)
    sums = mosaic_gpu.row_sumsq(g, interpret=True)
    np.testing.assert_allclose(np.asarray(sums), np.sum(g64**2, axis=1), rtol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
def test_lowers_to_one_mosaic_gpu_call_for_cuda(dtype):
    """9 rows of 4,097 features for 528 programs: one Mosaic GPU call, named, whose (9, 2)
    partial sums are one per program of the (rows, spans) grid."""
    g = jax.ShapeDtypeStruct((9, 4097), dtype)
    split = spans.splits(9, 4097, jnp.dtype(dtype).itemsize, 528)
    with for_gpu():
        exported = jax.export.export(
            jax.jit(lambda g: mosaic_gpu.row_sumsq(g, split=split)), platforms=["cuda"]
        )(g)
    text = exported.mlir_module()
    assert re.findall(r"custom_call @mosaic_gpu_v2\(.*?-> (tensor<\S+>)", text) == [
        "tensor<9x2xf32>"
    ]
    assert "fastgp_row_sumsq" in text


def test_a_leaf_past_int32_indexing_is_refused_by_name():
    g = jax.ShapeDtypeStruct((1 << 16, 1 << 15), jnp.bfloat16)
    with pytest.raises(ValueError, match=r"int32.*2\*\*31 or more.*backend='xla'"):
        jax.eval_shape(lambda g: mosaic_gpu.row_sumsq(g, interpret=True), g)
