"""fastgp._compiled: figures read from programs compiled for a TPU."""

import functools

import jax
import jax.numpy as jnp
import pytest

from fastgp._penalty.xla import xla_sumsq
from fastgp.kernels.penalty import row_blocks, row_sumsq

pytestmark = pytest.mark.aot
pytest.importorskip("jax.experimental.topologies")
from fastgp import _compiled as cf  # noqa: E402

HLO = """\
%fused_computation.1 (param_0: f32[8]) -> f32[8] {
  %param_0 = f32[8]{0} parameter(0)
  ROOT %copy.1 = f32[8]{0} copy(%param_0)
}

%loop_body (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  ROOT %copy.2 = f32[8]{0} copy(%p)
}

ENTRY %main (a: f32[8]) -> f32[8] {
  %a = f32[8]{0} parameter(0)
  %fusion = f32[8]{0} fusion(%a), kind=kLoop, calls=%fused_computation.1
  %copy-start = (f32[8]{0}, f32[8]{0}, u32[]) copy-start(%fusion)
  %copy-done = f32[8]{0} copy-done(%copy-start)
  ROOT %copy.3 = f32[8]{0:T(8)} copy(%copy-done)
}
"""


def test_copies_count_ops_of_their_own_not_fusion_roots():
    # copy.2 (a loop body's op) and copy.3 run as ops, copy.1 is a fusion's root.
    assert cf.count_copies(HLO) == {"copy": 2, "copy-start": 1}


def test_figures_of_a_kernel_are_what_it_declares_and_xla_reads_g_once():
    g = jax.ShapeDtypeStruct((256, 4096), jnp.float32)
    nbytes = 256 * 4096 * 4
    device = cf.tpu_device("v5e")
    blocks = row_blocks(256, 4096, 4, "v5e")
    kernel = cf.figures(cf.compile_for(device, functools.partial(row_sumsq, blocks=blocks), g))
    xla = cf.figures(cf.compile_for(device, xla_sumsq, g))
    assert kernel["kernel"] and not xla["kernel"]
    assert kernel["flops"] > 0 and xla["flops"] > 0
    # One read of g plus per-sample outputs, either way.
    for figures in (kernel, xla):
        assert nbytes <= figures["bytes"] <= 1.01 * nbytes
    assert kernel["argument"] == xla["argument"] == nbytes


def test_loops_count_the_while_loops_of_a_tpu_program():
    """A blockwise attention gradient (XLA loops over key and query blocks) against the same
    gradient through the Mosaic kernels: TPU HLO prints long tuple shapes with "/*index=5*/"
    comments, which the count must see past."""
    import fastgp

    q = jax.ShapeDtypeStruct((2, 2048, 4, 64), jnp.bfloat16)

    def grad(backend):
        loss = lambda q: jnp.sum(fastgp.attention(q, q, q, backend=backend).astype(jnp.float32))
        return jax.grad(loss)

    device = cf.tpu_device("v5e")
    loops = cf.figures(cf.compile_for(device, grad("xla"), q))
    kernels = cf.figures(cf.compile_for(device, grad("pallas"), q))
    assert "/*index=5*/" in cf.compile_for(device, grad("xla"), q).as_text()
    assert loops["loops"] >= 2 and loops["kernels"] == 0
    assert kernels["loops"] == 0 and kernels["kernels"] == 3  # forward, g_q, g_k and g_v
