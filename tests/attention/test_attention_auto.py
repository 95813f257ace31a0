"""What ``backend="auto"`` runs for attention: the kernels when traced for a TPU or an NVIDIA GPU
where they run per device, XLA elsewhere; the penalty's "auto" stays XLA. The kernels' exactness
against the oracle is ``test_attention_backends.py``'s (interpret modes); here, the choice."""

import functools
import re
import types

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import fastgp
from fastgp import _backends as backends
from fastgp._attention import sharding


@pytest.fixture
def on_tpu(monkeypatch):
    """Trace as if for a TPU: the platform ``auto`` reads, nothing else."""
    monkeypatch.setattr(backends, "platform", lambda: "tpu")


def test_auto_per_op_and_platform(on_tpu):
    assert backends.resolve("attention", "auto") == "pallas"
    assert backends.resolve("attention", "auto", lambda: False) == "xla"
    assert backends.resolve("penalty", "auto") == "xla"
    assert backends.resolve("attention", "xla") == "xla"  # an explicit choice is kept
    with fastgp.attention_backend("interpret"):
        assert backends.resolve("attention", "auto", lambda: False) == "interpret"
    with fastgp.attention_backend("auto"):
        assert backends.resolve("attention", "auto") == "pallas"


@pytest.mark.parametrize(
    "platform, chosen", [("tpu", "pallas"), ("cuda", "pallas"), ("rocm", "xla"), ("cpu", "xla")]
)
def test_attention_auto_runs_the_kernels_where_they_were_measured_faster(
    monkeypatch, platform, chosen
):
    monkeypatch.setattr(backends, "platform", lambda: platform)
    assert backends.resolve("attention", "auto") == chosen
    assert backends.resolve("penalty", "auto") == "xla"


@pytest.mark.parametrize("version, name", [("cuda 13000", "cuda"), ("rocm 7.0.2", "rocm")])
def test_a_gpu_is_named_by_its_vendors_stack(monkeypatch, version, name):
    """JAX names both vendors' GPUs "gpu"; the kernels were checked on an NVIDIA one only."""
    monkeypatch.setattr(backends, "traced_device", lambda: types.SimpleNamespace(platform="gpu"))
    client = types.SimpleNamespace(platform_version=version)
    monkeypatch.setattr(jax.extend.backend, "get_backend", lambda *a: client)
    assert backends.platform() == name


def test_the_platform_is_that_of_the_device_traced_for():
    """The default device, else the mesh's around the trace: a CPU mesh inside shard_map."""
    assert backends.platform() == "cpu"
    with jax.default_device(jax.devices()[3]):
        assert backends.traced_device() == jax.devices()[3]
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
    found = []

    def local(x):
        found.append((backends.traced_device().platform, backends.platform()))
        return x

    jax.jit(jax.shard_map(local, mesh=mesh, in_specs=P("data"), out_specs=P("data")))(jnp.ones(8))
    assert found == [("cpu", "cpu")]


@pytest.mark.aot
def test_a_compile_only_tpu_device_or_mesh_is_traced_for_as_a_tpu():
    """From this CPU host: attention's "auto" chooses as on the TPU it compiles for, the
    penalty's stays XLA."""
    pytest.importorskip("libtpu")
    from fastgp._measure import compiled as cf

    with jax.default_device(cf.tpu_device("v5e")):
        assert backends.platform() == "tpu"
        assert backends.resolve("attention", "auto") == "pallas"
        assert backends.resolve("penalty", "auto") == "xla"
    mesh = jax.sharding.Mesh(np.array(cf.tpu_devices("v5e:2x2")), ("data",))
    with jax.set_mesh(mesh):
        assert backends.platform() == "tpu"
    assert backends.platform() == "cpu"


def traced_backend(q, v) -> str:
    """The backend ``attention(backend="auto")`` traces on these operands' shapes."""
    text = str(jax.make_jaxpr(lambda q, v: fastgp.attention(q, q, v))(q, v))
    found = re.search(r"fastgp_attention_forward\[\s*config=Config\(.*backend='([a-z-]+)'", text)
    assert found, text
    return found[1]


@pytest.mark.parametrize(
    "head_dims, chosen", [((64, 64), "pallas"), ((128, 128), "pallas"), ((64, 256), "xla")]
)
def test_on_a_gpu_auto_keeps_head_dims_the_kernels_were_not_checked_with_on_xla(
    monkeypatch, head_dims, chosen
):
    monkeypatch.setattr(backends, "platform", lambda: "cuda")
    monkeypatch.setattr(jax, "device_count", lambda: 1)
    d, dv = head_dims
    q, v = jnp.ones((1, 16, 1, d)), jnp.ones((1, 16, 1, dv))
    assert traced_backend(q, v) == chosen
    monkeypatch.setattr(backends, "platform", lambda: "tpu")
    assert traced_backend(q, v) == "pallas"  # a TPU has no such limit


def operands(shape=(8, 16, 2, 4)):
    keys = jax.random.split(jax.random.key(0), 3)
    return [jax.random.normal(key, shape) for key in keys]


def per_device(spec, axis_type, mesh_shape=(4, 2), names=("data", "seq")):
    """kernels_run_per_device on operands placed with ``spec`` on a mesh of ``axis_type``."""
    mesh = jax.make_mesh(mesh_shape, names, axis_types=(axis_type,) * len(names))
    arrays = [jax.device_put(x, NamedSharding(mesh, spec)) for x in operands()]
    found = []
    with jax.set_mesh(mesh):
        jax.jit(lambda *a: found.append(sharding.kernels_run_per_device(*a)))(*arrays)
    return found[0]


def test_kernels_run_per_device_where_each_device_has_its_samples_and_heads(monkeypatch):
    assert per_device(P("data"), AxisType.Explicit)
    assert per_device(P("data", None, "seq"), AxisType.Explicit)  # heads split: still per device
    assert not per_device(P("data", "seq"), AxisType.Explicit)  # tokens split
    assert not per_device(P(None, None, None, "seq"), AxisType.Explicit)  # features split
    # an Auto-sharded program over several devices is split by the partitioner
    assert not per_device(P("data"), AxisType.Auto)
    monkeypatch.setattr(jax, "device_count", lambda: 1)
    assert per_device(P(), AxisType.Auto, mesh_shape=(1, 1))


def test_inside_shard_map_the_kernels_run_per_device():
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
    found = []

    def local(q, k, v):
        found.append(sharding.kernels_run_per_device(q, k, v))
        return q

    jax.jit(jax.shard_map(local, mesh=mesh, in_specs=P("data"), out_specs=P("data")))(*operands())
    assert found == [True]


def critic_step(attention_fn):
    """A WGAN-GP critic step's parameter gradient through one attention layer on (B, T, C)."""

    def critic(w, x):
        q, k, v = (jnp.einsum("btc,chd->bthd", x, w[i]) for i in range(3))
        return jnp.tanh(attention_fn(q, k, v, is_causal=True)).sum(axis=(1, 2, 3))

    def loss(w, real, fake, key):
        gp = fastgp.gradient_penalty(lambda y: critic(w, y), fastgp.interpolate(key, real, fake))
        return critic(w, fake).mean() - critic(w, real).mean() + gp

    return jax.grad(loss)


@pytest.mark.aot
def test_the_default_wgan_gp_step_through_attention_holds_the_kernels_on_one_tpu(monkeypatch):
    """Lowered for one v5e chip from this CPU host with the default backend: the forward, tangent
    and both VJP kernels are in the program (and with backend="xla" none is)."""
    pytest.importorskip("libtpu")
    from fastgp._measure import compiled as cf

    monkeypatch.setattr(jax, "device_count", lambda: 1)  # this host's CPUs are not the program's
    b, t, c = 4, 256, 64
    args = (
        jax.ShapeDtypeStruct((3, c, 2, 64), jnp.bfloat16),
        jax.ShapeDtypeStruct((b, t, c), jnp.bfloat16),
        jax.ShapeDtypeStruct((b, t, c), jnp.bfloat16),
        jax.eval_shape(lambda: jax.random.key(0)),
    )
    device = cf.tpu_device("v5e")
    counts = {}
    for backend in ("auto", "xla"):
        step = critic_step(functools.partial(fastgp.attention, backend=backend))
        text = cf.compile_for(device, step, *args).as_text()
        counts[backend] = text.count('custom_call_target="tpu_custom_call"')
    assert counts["xla"] == 0
    assert counts["auto"] >= 4, counts
