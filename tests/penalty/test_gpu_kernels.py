"""Pallas GPU (Triton) kernel: interpret mode against float64, and the penalty's GPU kernels
(Triton, and Mosaic GPU where the JAX has it) lowered for CUDA on CPU, for an abstract H100.

The penalty through the Triton kernel in interpret mode, against the naive penalty, is one backend
of tests/penalty/test_penalty_backends.py; the Mosaic GPU kernel against float64 is in
tests/penalty/test_mosaic_gpu_kernel.py."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from fastgp import penalty
from fastgp._gpu import pallas as pallas_gpu
from fastgp._gpu.lowering import H100, for_gpu, gpu_mesh
from fastgp.kernels.penalty import spans

penalty_gpu = pytest.importorskip(
    "fastgp.kernels.penalty.gpu", reason="this JAX ships no Pallas Triton backend"
)

TRITON = jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")
CALLS = {"triton": "__gpu$xla.gpu.triton", "mosaic_gpu": "mosaic_gpu_v2"}
GPU_KERNELS = ["triton"] + (["mosaic_gpu"] if pallas_gpu.has_mosaic_gpu() else [])


@pytest.fixture(params=GPU_KERNELS)
def gpu_kernel(request, monkeypatch):
    """Each GPU kernel this JAX runs, as the penalty's kernel for every device (JAX's caches
    cleared around it: a program traced with the other kernel is not reused)."""
    monkeypatch.setattr(pallas_gpu, "penalty_kernel", lambda device: request.param)
    jax.clear_caches()
    yield request.param
    jax.clear_caches()


def export_for_gpu(fn, *args, mesh=None, device=H100):
    """``jax.jit(fn)`` exported for CUDA, traced and lowered for an abstract GPU (an H100)."""
    with for_gpu(mesh, device):
        return jax.export.export(jax.jit(fn), platforms=["cuda"], disabled_checks=[TRITON])(*args)


def grid(kernel, text):
    """(spans, rows) of the norm kernel's grid in a CUDA program: the Triton call's launch, or
    the (rows, spans) partial sums the Mosaic GPU call returns (one per program)."""
    if kernel == "triton":
        return re.findall(r"grid_x = (\d+) : i32, grid_y = (\d+)", text)
    shapes = re.findall(r"custom_call @mosaic_gpu_v2\(.*?-> tensor<(\d+)x(\d+)xf32>", text)
    return [(s, b) for b, s in shapes]


@pytest.mark.parametrize("batch,features", [(1, 1), (3, 100), (9, 4097), (2, 70000)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16, jnp.float16])
@pytest.mark.parametrize("programs", [1, 5, 528])
def test_gpu_kernel_matches_float64(batch, features, dtype, programs):
    """One program a row, and rows split into spans (the last one short: 70,000 features are 17
    chunks of 4,096 and a part; 5 programs for 1-2 rows split them in 3-5 spans)."""
    rng = np.random.default_rng(features)
    g = jnp.asarray(rng.standard_normal((batch, features)), dtype)
    g64 = np.asarray(g.astype(jnp.float32), np.float64)
    split = spans.splits(batch, features, g.dtype.itemsize, programs)
    sums = np.asarray(penalty_gpu.row_sumsq(g, split=split, interpret=True))
    assert sums.dtype == np.float32
    np.testing.assert_allclose(sums, np.sum(g64**2, axis=1), rtol=1e-6)


@pytest.mark.parametrize("batch", [1, 4, 64, 1024])
@pytest.mark.parametrize("features", [1, 3000, 70000, 1 << 20])
@pytest.mark.parametrize("programs", [1, 132, 528])
def test_spans_cover_each_row_once_and_fill_the_grid(batch, features, programs):
    """Whole chunks a span, no span empty, every feature in one span; the grid reaches the
    programs asked for where the row has chunks for them, and splits no row that needs none."""
    split = spans.splits(batch, features, 4, programs)
    row_chunks = -(-features // split.chunk)
    assert split.chunk & (split.chunk - 1) == 0 and 128 <= split.chunk <= spans.MAX_CHUNK
    assert (split.spans - 1) * split.chunks < row_chunks <= split.spans * split.chunks
    assert batch * split.spans >= min(programs, batch * row_chunks)
    if batch >= programs:
        assert split.spans == 1


def critic(params, x):
    return jnp.tanh(x.reshape(x.shape[0], -1) @ params["w"]) @ params["v"]


@pytest.mark.parametrize("backend", ["auto", "pallas"])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_whole_penalty_step_lowers_for_cuda(backend, dtype, gpu_kernel):
    """``pallas`` puts the GPU kernel in the CUDA program; ``auto`` keeps CUDA on XLA until
    the kernel has been run and timed faster on a GPU."""
    params = {"w": jax.ShapeDtypeStruct((300, 8), dtype), "v": jax.ShapeDtypeStruct((8,), dtype)}
    x = jax.ShapeDtypeStruct((12, 3, 100), dtype)
    step = jax.value_and_grad(
        lambda p, x: penalty.gradient_penalty(lambda y: critic(p, y), x, backend=backend)
    )
    text = export_for_gpu(step, params, x).mlir_module()
    if backend == "pallas":
        assert CALLS[gpu_kernel] in text and "fastgp_row_sumsq" in text
    else:
        assert not any(call in text for call in CALLS.values())


def test_the_kernel_is_triton_while_jax_ships_it_then_mosaic_gpu_from_hopper(monkeypatch):
    """Triton (the kernel run on a GPU) wherever JAX ships it; without it, an H100 (also an
    abstract one, which names no compute capability, as Mosaic GPU assumes) runs the Mosaic GPU
    kernel where this JAX has it, and an A100 (sm_80) has no kernel."""

    class A100:
        platform, device_kind, compute_capability = "gpu", "NVIDIA A100-SXM4-80GB", "8.0"

    class H100(A100):
        device_kind, compute_capability = "NVIDIA H100 80GB HBM3", "9.0"

    for device in (H100(), gpu_mesh().abstract_device, A100()):
        assert pallas_gpu.penalty_kernel(device) == "triton"
    monkeypatch.setattr(pallas_gpu, "has_triton", lambda: False)
    monkeypatch.setattr(pallas_gpu, "has_mosaic_gpu", lambda: True)
    assert pallas_gpu.penalty_kernel(H100()) == "mosaic_gpu"
    assert pallas_gpu.penalty_kernel(gpu_mesh().abstract_device) == "mosaic_gpu"
    assert pallas_gpu.penalty_kernel(A100()) is None


def test_few_rows_split_over_the_grid_for_cuda(gpu_kernel):
    """64 rows of 2^20 features, lowered for CUDA for an abstract H100 (132 multiprocessors, 4
    programs each: at least 9 spans a row): 10 spans of 28 chunks (the last of 4), a (10, 64)
    grid of 640 programs, where one program a row had 64."""
    g = jax.ShapeDtypeStruct((64, 1 << 20), jnp.float32)
    step = lambda g: penalty.grad_norms(g, backend="pallas")
    text = export_for_gpu(step, g).mlir_module()
    assert grid(gpu_kernel, text) == [("10", "64")]


@pytest.mark.parametrize("spec", [P("data"), P("data", "model")], ids=["batch", "batch+feature"])
def test_sharded_step_exports_for_cuda_with_the_kernel_call_per_device(spec, gpu_kernel):
    """Under jax.jit with NamedSharding on an explicit mesh (no shard_map in the step), the CUDA
    program runs the GPU kernel inside a manual computation on each device's block, with no
    all-gather; the feature-sharded leaf's partial sums take one all-reduce."""
    mesh = gpu_mesh(jax.make_mesh((2, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2))
    replicated, data = NamedSharding(mesh, P()), NamedSharding(mesh, spec)
    params = {
        "w": jax.ShapeDtypeStruct((300, 8), jnp.float32, sharding=replicated),
        "v": jax.ShapeDtypeStruct((8,), jnp.float32, sharding=replicated),
    }
    x = jax.ShapeDtypeStruct((12, 300), jnp.float32, sharding=data)
    step = jax.value_and_grad(
        lambda p, x: penalty.gradient_penalty(
            lambda y: jnp.tanh(y @ p["w"]) @ p["v"], x, backend="pallas"
        )
    )
    exported = export_for_gpu(step, params, x, mesh=mesh)
    text = exported.mlir_module()
    assert exported.nr_devices == 4
    assert CALLS[gpu_kernel] in text and "sdy.manual_computation" in text
    assert "all_gather" not in text
    reduced = re.findall(r"sdy\.all_reduce|stablehlo\.all_reduce", text)
    assert bool(reduced) == (spec == P("data", "model"))


def test_the_kernel_runs_per_device_inside_shard_map_for_cuda(gpu_kernel):
    """Inside ``shard_map(check_vma=True)`` over 4 abstract H100s, the per-device norms of a
    batch-sharded leaf are the GPU kernel's, typed as varying over the batch axis (as every other
    branch of the call is), with no collective."""
    mesh = gpu_mesh(jax.make_mesh((4,), ("data",), axis_types=(AxisType.Explicit,)))
    norms = jax.shard_map(
        lambda g: penalty.grad_norms(g, backend="pallas"),
        mesh=mesh,
        in_specs=P("data"),
        out_specs=P("data"),
    )
    g = jax.ShapeDtypeStruct((16, 300), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    exported = export_for_gpu(norms, g, mesh=mesh)
    text = exported.mlir_module()
    assert exported.nr_devices == 4 and CALLS[gpu_kernel] in text
    assert not re.search(r"all_gather|all_reduce", text)


def test_auto_sharded_export_names_explicit_sharding_instead():
    """custom_partitioning's Python callbacks cannot be serialized: exporting an Auto-sharded step
    with the kernel is refused by name, with the spelling that exports."""
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ("data",))
    w = jax.ShapeDtypeStruct((300,), jnp.float32, sharding=NamedSharding(mesh, P()))
    x = jax.ShapeDtypeStruct((12, 300), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    step = jax.grad(
        lambda w, x: penalty.gradient_penalty(lambda y: jnp.tanh(y) @ w, x, backend="pallas")
    )
    with pytest.raises(ValueError, match=r"cannot hold.*explicit sharding"):
        jax.export.export(jax.jit(step), platforms=["cuda"], disabled_checks=[TRITON])(w, x)


class _TunedGpu:
    """A traced GPU of 16 multiprocessors that the tuned table names."""

    platform, device_kind, core_count = "gpu", "A small GPU", 16


def test_the_tuned_table_sets_the_programs_per_multiprocessor(monkeypatch, gpu_kernel):
    """The traced GPU's multiprocessors times its tuned programs each (16 x 2 = 32): 4 rows of
    2^20 features split into 8 spans."""
    from fastgp._gpu import tuned as _gpu_tuned

    monkeypatch.setattr(_gpu_tuned, "_device", lambda: _TunedGpu())
    row = {"penalty": {"programs_per_sm": 2}}
    monkeypatch.setattr(_gpu_tuned, "table", lambda: {_TunedGpu.device_kind: row})
    g = jax.ShapeDtypeStruct((4, 1 << 20), jnp.float32)
    step = lambda g: penalty.grad_norms(g, backend="pallas")
    assert grid(gpu_kernel, export_for_gpu(step, g).mlir_module()) == [("8", "4")]


def test_an_abstract_gpu_counts_its_multiprocessors_in_num_cores(gpu_kernel):
    """An abstract GPU of 16 multiprocessors (4 programs each: 64): 4 rows of 2^20 features
    split into 16 spans of 16 chunks."""
    device = jax.sharding.AbstractDevice(device_kind="NVIDIA H100", num_cores=16, platform="gpu")
    g = jax.ShapeDtypeStruct((4, 1 << 20), jnp.float32)
    step = lambda g: penalty.grad_norms(g, backend="pallas")
    assert grid(gpu_kernel, export_for_gpu(step, g, device=device).mlir_module()) == [("16", "4")]
