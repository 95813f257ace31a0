"""fastgp.measure (fastgp._measure.compiled): figures read from programs compiled for a TPU."""

import functools
import re

import jax
import jax.numpy as jnp
import pytest

from fastgp._penalty.xla import xla_sumsq
from fastgp.kernels.penalty import row_blocks, row_sumsq

pytestmark = pytest.mark.aot
pytest.importorskip("jax.experimental.topologies")
from fastgp._measure import compiled as cf  # noqa: E402

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


PERMUTES = """\
%loop_body (p: bf16[8]) -> bf16[8] {
  %p = bf16[8]{0} parameter(0)
  %collective-permute-start = (bf16[8]{0}, bf16[8]{0}) collective-permute-start(%p), channel_id=1
  %custom-call = bf16[8]{0} custom-call(%p), custom_call_target="tpu_custom_call"
  %collective-permute-start.1 = (bf16[8]{0}, bf16[8]{0}) collective-permute-start(%p), channel_id=2
  %collective-permute-done = bf16[8]{0} collective-permute-done(%collective-permute-start)
  %fusion = bf16[8]{0} fusion(%p), kind=kLoop, calls=%fused_computation.1
  ROOT %collective-permute-done.1 = bf16[8]{0} collective-permute-done(%collective-permute-start.1)
}

ENTRY %main (a: bf16[8]) -> bf16[8] {
  %a = bf16[8]{0} parameter(0)
  %collective-permute-start.2 = (bf16[8]{0}, bf16[8]{0}) collective-permute-start(%a), channel_id=3
  ROOT %collective-permute-done.2 = bf16[8]{0} collective-permute-done(%collective-permute-start.2)
}
"""


def test_transfers_pair_each_start_with_its_own_done():
    """Each permute sees what lies between its start and its own done (the second start's done
    comes after a fusion, the first's before it), per computation."""
    assert cf.transfers(PERMUTES) == [
        cf.Transfer("%loop_body", kernels=1, fusions=0),
        cf.Transfer("%loop_body", kernels=0, fusions=1),
        cf.Transfer("%main", kernels=0, fusions=0),
    ]


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


@pytest.mark.parametrize("generation", ["v5e", "v6e"])
def test_a_program_lowered_for_a_chip_tiles_its_kernels_for_that_chip(generation):
    """The figures are of the program the chip would run: attention's Mosaic call, lowered for a
    generation from this CPU host, carries the cost (which counts its K/V passes, one per query
    block) of the forward kernel at that generation's blocks, not at the unknown target's."""
    import fastgp
    from fastgp.kernels import attention as kernels

    t, heads, d = 4096, 2, 64
    q = jax.ShapeDtypeStruct((1, t, heads, d), jnp.bfloat16)
    device = cf.tpu_device(generation)
    fused = cf.lower_for(device, lambda q: fastgp.attention(q, q, q, backend="pallas"), q)

    def forward_at(tiles):
        qt = jax.ShapeDtypeStruct((1, heads, t, d), jnp.bfloat16)
        mask = jax.ShapeDtypeStruct((1, t), jnp.int32)
        run = lambda q, m: kernels.flash_forward(
            q,
            q,
            q,
            m,
            scale=d**-0.5,
            causal=False,
            block_q=tiles.block_q,
            block_k=tiles.block_k,
            vmem_limit_bytes=tiles.vmem_limit_bytes,
        )
        return _kernel_bytes(cf.lower_for(device, run, qt, mask).as_text())

    chip, unknown = kernels.blocks(t, t, d, 2, generation), kernels.blocks(t, t, d, 2, None)
    assert chip.block_q != unknown.block_q  # else this test could not tell them apart
    assert _kernel_bytes(fused.as_text()) == forward_at(chip) != forward_at(unknown)


def _kernel_bytes(text):
    """The bytes_accessed of the one Mosaic call in a lowered program's text."""
    (found,) = re.findall(r"bytes_accessed(?:\\22|\W)*(\d+)", text)  # \22: an escaped quote
    return int(found)
