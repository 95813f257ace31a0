"""The GPU (Triton) attention kernels in Pallas interpret mode, against the TPU kernels' oracles,
and lowered for CUDA from this host for an abstract H100 (``fastgp._gpu.lowering``).

Each pass of ``fastgp.kernels.attention.gpu`` against the same independent oracles as the TPU
kernels (tests/attention/test_attention_kernels.py): the forward against naive attention, the
tangent and VJP against ``jax.jvp``/``jax.vjp`` of it, the second-order passes against JAX's
derivatives of the dense tangent pass; float32 at rtol 1e-5 and bf16 against the float32 oracle.
Cases: the TPU set with lengths a multiple of 16 (Triton's smallest matmul), blocks from
``gpu_blocks``, so that several query and key blocks, causal skipping, empty rows and a key
block no query sees are all reached; and the TPU set's cases at a non-zero query offset.
"""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P
from test_attention import RTOL, derivatives, pair, rel_err
from test_attention_kernels import (
    CASES,
    OFFSET_CASES,
    SCALE,
    Case,
    assert_matches,
    close,
    empty_rows,
    f32,
    inputs,
    oracle,
    second_order_inputs,
    second_order_oracles,
)

import fastgp
from fastgp._gpu.lowering import for_gpu, gpu_mesh

gpu = pytest.importorskip(
    "fastgp.kernels.attention.gpu", reason="this JAX ships no Pallas Triton backend"
)

TRITON = jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")


def export_for_gpu(fn, *args, mesh=None):
    """``fn`` (jitted) exported for CUDA, traced and lowered for an abstract H100."""
    with for_gpu(mesh):
        return jax.export.export(fn, platforms=["cuda"], disabled_checks=[TRITON])(*args)


def gpu_case(case: Case) -> Case:
    block_q, block_k = gpu.gpu_blocks(case.tq, case.tk)
    return dataclasses.replace(case, bq=block_q, bk=block_k)


GPU_CASES = [gpu_case(c) for c in CASES[:3]] + [
    gpu_case(Case(1, 2, 48, 32, 32, 32, True, 0, 0, "none")),  # short: blocks of 16 and 32
]
# make check runs the two cases that reach every masking path; make test all four. The TPU
# set's offset cases keep their blocks of 32 (two query blocks, three or four key blocks), a
# size Triton takes, and run in both.
RUNS = [
    pytest.param(case, marks=[] if case in GPU_CASES[1:3] else [pytest.mark.slow])
    for case in GPU_CASES
] + OFFSET_CASES


def run(name, case, *args):
    return gpu.PASSES[name](
        *args,
        scale=SCALE,
        causal=case.causal,
        block_q=case.bq,
        block_k=case.bk,
        interpret=True,
        q_offset=case.q_offset,
    )


@pytest.mark.parametrize("case", RUNS, ids=str)
def test_first_order_passes_match_naive_attention(case):
    p, t, g_o, g_lse, mask = inputs(case)
    x, d = (p["q"], p["k"], p["v"]), (t["q"], t["k"], t["v"])
    fn = oracle(case, mask)
    (ref_o, ref_lse), (ref_do, ref_dlse) = jax.jit(lambda x, d: jax.jvp(fn, x, d))(x, d)
    want_grads = jax.jit(lambda x, g: jax.vjp(fn, *x)[1](g))(x, (g_o, g_lse))
    o, lse = run("forward", case, *x, mask)
    close(o, ref_o, 1e-5)
    close(lse, ref_lse, 1e-5)
    do, dlse = run("tangent", case, *x, o, lse, mask, *d)
    close(do, ref_do, 1e-5)
    close(dlse, ref_dlse, 1e-5)
    grads = run("vjp", case, *x, o, lse, mask, g_o, g_lse)
    for got, want in zip(grads, want_grads, strict=True):
        close(got, want, 1e-5)
    rows = empty_rows(case).nonzero()
    for out in (o, do, grads[0]):
        assert np.all(np.asarray(out)[rows[0], :, rows[1]] == 0)


def second_order(case, primal, mask, d, g, dot):
    return {
        "tangent_jvp": run("tangent_jvp", case, *primal, mask, *d, *dot),
        "vjp_jvp": run("vjp_jvp", case, *primal, mask, *g, *dot),
        "second_vjp": run("second_vjp", case, *primal, mask, *d, *g),
    }


@pytest.mark.parametrize("case", RUNS, ids=str)
def test_second_order_passes_match_autodiff_of_the_dense_passes(case):
    primal, mask, d, g, dot = second_order_inputs(case)
    want = second_order_oracles(case, primal, mask, d, g, dot)
    assert_matches(second_order(case, primal, mask, d, g, dot), want, primal, 1e-5)


def test_bf16_inputs_match_the_float32_oracle():
    case = GPU_CASES[1]
    p, t, g_o, g_lse, mask = inputs(case, jnp.bfloat16, seed=2)
    x, d = (p["q"], p["k"], p["v"]), (t["q"], t["k"], t["v"])
    fn = oracle(case, mask)
    x32, d32 = tuple(f32(a) for a in x), tuple(f32(a) for a in d)
    (ref_o, _), (ref_do, _) = jax.jvp(fn, x32, d32)
    o, lse = run("forward", case, *x, mask)
    assert o.dtype == jnp.bfloat16 and lse.dtype == jnp.float32
    close(o, ref_o, 2e-2)
    do, _ = run("tangent", case, *x, o, lse, mask, *d)
    assert do.dtype == jnp.bfloat16
    close(do, ref_do, 3e-2)
    grads = run("vjp", case, *x, o, lse, mask, g_o, g_lse)
    for got, want in zip(grads, jax.vjp(fn, *x32)[1]((f32(g_o), g_lse)), strict=True):
        assert got.dtype == jnp.bfloat16
        close(got, want, 3e-2)
    primal, mask, d, g, dot = second_order_inputs(case, jnp.bfloat16, seed=7)
    want = second_order_oracles(case, primal, mask, d, g, dot)
    assert_matches(second_order(case, primal, mask, d, g, dot), want, primal, 3e-2)


# The kernels lowered directly, not through fastgp (which shows JAX's deprecation once).
@pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated:DeprecationWarning")
@pytest.mark.parametrize("name", list(gpu.PASSES))
def test_every_pass_lowers_to_triton_for_cuda(name):
    """bf16, D = 64, T = 768 (not a power of two: the walked side is sliced, never whole)."""
    s = jax.ShapeDtypeStruct
    b, h, t, d = 2, 2, 768, 64
    x, rows = s((b, h, t, d), jnp.bfloat16), s((b, h, t), jnp.float32)
    mask = s((b, t), jnp.int32)
    primal = (x, x, x, x, rows)
    operands = {
        "forward": (x, x, x, mask),
        "tangent": (*primal, mask, x, x, x),
        "vjp": (*primal, mask, x, rows),
        "tangent_jvp": (*primal, mask, x, x, x, *primal),
        "vjp_jvp": (*primal, mask, x, rows, *primal),
        "second_vjp": (*primal, mask, x, x, x, x, rows),
    }[name]
    block_q, block_k = gpu.gpu_blocks(t, t)
    fn = lambda *a: gpu.PASSES[name](*a, scale=0.125, causal=True, block_q=block_q, block_k=block_k)
    text = export_for_gpu(jax.jit(fn), *operands).mlir_module()
    calls = 2 if name in ("vjp", "vjp_jvp", "second_vjp") else 1
    assert text.count("__gpu$xla.gpu.triton") == calls
    assert f"fastgp_attention_{name}" in text


def _critic_step(backend, second_order):
    """A one-block attention critic's WGAN-GP step (critic loss + penalty, value_and_grad)."""

    def critic(params, x):
        b, t, _ = x.shape
        q, k, v = (jnp.tanh(x @ params[n]).reshape(b, t, 2, 64) for n in "qkv")
        o = jnp.asarray(0.0) + fastgp.attention(q, k, v, is_causal=True, backend=backend)
        return jnp.mean(o.reshape(b, t, -1) @ params["out"], axis=(1, 2))

    def loss(params, real, fake, key):
        score = lambda x: critic(params, x)
        x_hat = fastgp.interpolate(key, real, fake)
        penalty = fastgp.gradient_penalty(score, x_hat, second_order=second_order)
        return jnp.mean(score(fake)) - jnp.mean(score(real)) + penalty

    return jax.value_and_grad(loss)


@pytest.mark.parametrize("second_order", ["reverse-over-forward", "reverse"])
def test_the_whole_penalty_step_runs_every_pass_on_triton_for_cuda(second_order, monkeypatch):
    """backend="pallas" exported for CUDA: the forward, tangent, VJP and second-order kernels
    are all Triton calls (nested reverse mode adds vjp_jvp's transposes, which are second_vjp).
    ``auto`` follows the device it is traced for: the abstract H100, so the same kernels; this
    CPU host, so XLA's loops. (A host of one device, as a GPU host with one GPU: "auto" takes the
    kernels in an Auto-sharded program on one device only.)"""
    monkeypatch.setattr(jax, "device_count", lambda: 1)
    s = jax.ShapeDtypeStruct
    params = {n: s((32, 128), jnp.bfloat16) for n in "qkv"} | {"out": s((128, 1), jnp.bfloat16)}
    x = s((4, 256, 32), jnp.bfloat16)
    key = jax.random.key(0)
    texts = {}
    for backend in ("pallas", "auto"):
        step = jax.jit(_critic_step(backend, second_order))
        texts[backend] = export_for_gpu(step, params, x, x, key).mlir_module()
    step = jax.jit(_critic_step("auto", second_order))
    on_cpu = jax.export.export(step, platforms=["cuda"])(params, x, x, key).mlir_module()
    for backend in ("pallas", "auto"):
        for name in ("forward", "tangent", "vjp_q", "vjp_kv", "second_vjp_q", "second_vjp_kv"):
            assert f'"fastgp_attention_{name}' in texts[backend], (backend, name)
        assert "stablehlo.while" not in texts[backend]  # every loop is inside a kernel
    assert "__gpu$xla.gpu.triton" not in on_cpu


def test_head_dims_that_are_not_powers_of_two_are_padded_for_the_kernels():
    """D = 48 and Dv = 24 (Triton needs powers of two >= 16): every derivative through
    ``backend="gpu-interpret"`` equals naive attention's."""
    ks = jax.random.split(jax.random.PRNGKey(4), 6)
    shapes = [(2, 40, 2, 48), (2, 56, 2, 48), (2, 56, 2, 24)]
    args = tuple(jax.random.normal(k, s) for k, s in zip(ks[:3], shapes, strict=True))
    tangents = tuple(jax.random.normal(k, s) for k, s in zip(ks[3:], shapes, strict=True))
    mask = jnp.arange(56)[None] < jnp.array([[50], [33]])
    ours, naive = pair(mask, True, "gpu-interpret")
    got, want = derivatives(ours, args, tangents), derivatives(naive, args, tangents)
    for name in want:
        assert rel_err(got[name], want[name]) < RTOL, name


@pytest.mark.parametrize("scheme", ["ring", "all-gather"])
def test_auto_on_a_gpu_runs_the_kernels_per_shard_with_the_tokens_split(scheme):
    """Traced for CUDA on a mesh of abstract H100s, ``backend="auto"`` inside shard_map with the
    tokens split over "seq": the reverse-over-forward derivative a penalty takes is Triton calls
    per shard, with the key and value blocks passed around the ring (collective-permutes, no
    gather) or gathered (and no XLA loop over score tiles)."""
    mesh = gpu_mesh(jax.make_mesh((2, 2), ("data", "seq"), axis_types=(AxisType.Auto,) * 2))
    spec = P("data", "seq")

    def local(q, k, v):
        return fastgp.attention(
            q, k, v, is_causal=True, sample_axis_name="seq", sequence_parallel=scheme
        )

    fn = jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec)
    loss = lambda *a: jnp.sum(jnp.sin(jax.jvp(fn, a, a)[1]))
    step = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    s = jax.ShapeDtypeStruct((4, 64, 2, 32), jnp.bfloat16)
    text = jax.export.export(step, platforms=["cuda"], disabled_checks=[TRITON])(s, s, s)
    text = text.mlir_module()
    assert text.count("__gpu$xla.gpu.triton") >= 4
    if scheme == "ring":
        assert "collective_permute" in text and "all_gather" not in text
    else:
        assert "stablehlo.while" not in text
        assert "all_gather" in text


class _TunedGpu:
    """A traced device the tuned table names (lowering for CUDA from this host names none)."""

    platform, device_kind, core_count = "gpu", "NVIDIA H200", 132


def test_the_tuned_table_sets_each_pass_launch(monkeypatch):
    """The traced GPU's row of fastgp/tuned/gpu.json sets a pass's tile edge, warps and stages at
    its head dim; a pass or head dim it does not name keeps the defaults (64, 4 warps, 2
    stages). Read from the CUDA program's Triton calls."""
    from fastgp._gpu import tuned as _gpu_tuned

    row = {"attention": {"forward": {"64": {"block": 32, "num_warps": 8, "num_stages": 3}}}}
    monkeypatch.setattr(_gpu_tuned, "_device", lambda: _TunedGpu())
    monkeypatch.setattr(_gpu_tuned, "table", lambda: {_TunedGpu.device_kind: row})
    fn = lambda q, k, v: fastgp.attention(q, k, v, backend="pallas")
    step = jax.jit(lambda q, k, v: jax.vjp(fn, q, k, v)[1](fn(q, k, v)))
    launches = {}
    for d in (64, 32):
        s = jax.ShapeDtypeStruct((2, 256, 2, d), jnp.bfloat16)
        launches[d] = re.findall(
            r"grid_z = (\d+) : i32.*?num_stages = (\d+) : i32, num_warps = (\d+)",
            export_for_gpu(step, s, s, s).mlir_module(),
        )
    # (grid_z: query or key blocks of 256, stages, warps) of the forward, then the VJP's two
    assert launches[64] == [("8", "3", "8"), ("4", "2", "4"), ("4", "2", "4")]
    assert launches[32] == [("4", "2", "4")] * 3
