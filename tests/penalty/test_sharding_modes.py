"""The kernels wherever a JAX trainer shards: Auto-sharded jax.jit, explicit axes, 2-D meshes and
shard_map, on 4 and 8 CPU devices, against the naive nested-grad penalty on one device.

Each program computes the penalty's value, its parameter gradients and a Hessian-vector product
(forward over the gradient) for an MLP, an NHWC conv critic and a pytree input. The compiled
programs are read too: the kernel backends must not gather x or a gradient leaf, and must not add
a collective to what the plain XLA reduction needs; the partial sums of a leaf sharded along a
reduced axis cost exactly one all-reduce.
"""

import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from benchmarks.tpu.collectives import arrays_moved
from fastgp import penalty
from fastgp._penalty import reference
from oracles import value_grad_hvp

BATCH = 16
KERNEL_BACKENDS = ["interpret", "tpu-interpret"]


# --- Critics the library knows nothing about ----------------------------------------------------


def mlp():
    def init(key):
        k1, k2 = jax.random.split(key)
        return {
            "w1": jax.random.normal(k1, (12, 16)) * 0.6,
            "b1": jnp.zeros(16),
            "w2": jax.random.normal(k2, (16,)) * 0.5,
        }

    def apply(p, x):
        return jnp.tanh(x @ p["w1"] + p["b1"]) @ p["w2"]

    return init, apply, jnp.zeros((BATCH, 12))


def nhwc_conv():
    def init(key):
        k1, k2 = jax.random.split(key)
        return {
            "c1": jax.random.normal(k1, (3, 3, 3, 8)) * 0.4,
            "head": jax.random.normal(k2, (4 * 4 * 8,)) * 0.3,
        }

    def apply(p, x):
        h = lax.conv_general_dilated(
            x, p["c1"], (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )
        return jax.nn.leaky_relu(h, 0.2).reshape(x.shape[0], -1) @ p["head"]

    return init, apply, jnp.zeros((BATCH, 8, 8, 3))


def pytree():
    def init(key):
        k1, k2 = jax.random.split(key)
        return {"w": jax.random.normal(k1, (4 * 6, 8)) * 0.4, "v": jax.random.normal(k2, (6, 8))}

    def apply(p, x):
        h = x["img"].reshape(x["img"].shape[0], -1) @ p["w"] + x["vec"] @ p["v"]
        return jnp.sum(jnp.sin(h), axis=1)

    return init, apply, {"img": jnp.zeros((BATCH, 4, 6)), "vec": jnp.zeros((BATCH, 6))}


CRITICS = {"mlp": mlp, "nhwc-conv": nhwc_conv, "pytree": pytree}


def problem(name):
    init, apply, template = CRITICS[name]()
    keys = jax.random.split(jax.random.PRNGKey(7), 3)
    params = init(keys[0])
    leaves, tree = jax.tree.flatten(template)
    x = tree.unflatten(  # type: ignore[attr-defined]  # jaxlib ships no PyTreeDef stubs
        [
            jax.random.normal(k, leaf.shape)
            for k, leaf in zip(jax.random.split(keys[1], len(leaves)), leaves, strict=True)
        ]
    )
    tangent = jax.tree.map(lambda a: jax.random.normal(keys[2], a.shape), params)
    return apply, params, x, tangent


def figures(penalty_fn, apply, params, x, tangent):
    """(value, parameter gradients, Hessian-vector product along ``tangent``)."""
    loss = lambda p: penalty_fn(functools.partial(apply, p), x)
    return value_grad_hvp(loss, params, tangent)


@functools.cache
def naive_figures(name):
    apply, params, x, tangent = problem(name)
    return jax.jit(functools.partial(figures, reference.naive_gradient_penalty, apply))(
        params, x, tangent
    )


# --- Sharding modes -----------------------------------------------------------------------------

# x's PartitionSpec per leaf: the batch over "data", and on the 2-D mesh a reduced axis (a
# feature, spatial or image axis) over "model".
BATCH_SPEC = {"mlp": P("data"), "nhwc-conv": P("data"), "pytree": P("data")}
MODEL_SPEC = {
    "mlp": P("data", "model"),
    "nhwc-conv": P("data", "model"),
    "pytree": {"img": P("data", "model"), "vec": P("data", "model")},
}
MODES = ("jit-batch", "jit-2d", "jit-replicated", "explicit", "explicit-2d", "shard_map")


def mesh_for(mode, devices, axis_type=AxisType.Auto):
    devs = np.array(jax.devices()[:devices])
    if mode.endswith("2d"):
        return Mesh(devs.reshape(devices // 2, 2), ("data", "model"), axis_types=(axis_type,) * 2)
    return Mesh(devs, ("data",), axis_types=(axis_type,))


def x_spec(mode, name):
    if mode == "jit-replicated":
        return jax.tree.map(lambda _: P(), CRITICS[name]()[2])
    spec = MODEL_SPEC[name] if mode.endswith("2d") else BATCH_SPEC[name]
    if isinstance(spec, P):
        return jax.tree.map(lambda _: spec, CRITICS[name]()[2])
    return spec


def compiled_figures(mode, devices, name, backend):
    """(figures, compiled HLO text) of the penalty program in sharding ``mode``."""
    apply, params, x, tangent = problem(name)
    ours = functools.partial(penalty.gradient_penalty, backend=backend)
    step = functools.partial(figures, ours, apply)
    if mode == "shard_map":
        mesh = mesh_for(mode, devices)
        inner = functools.partial(figures, functools.partial(ours, axis_name="data"), apply)
        fn = jax.jit(
            jax.shard_map(
                inner, mesh=mesh, in_specs=(P(), P("data"), P()), out_specs=P(), check_vma=True
            )
        )
        args = (params, jax.device_put(x, NamedSharding(mesh, P("data"))), tangent)
        return fn(*args), fn.lower(*args).compile().as_text()
    explicit = mode.startswith("explicit")
    mesh = mesh_for(mode, devices, AxisType.Explicit if explicit else AxisType.Auto)
    named = lambda spec: NamedSharding(mesh, spec)
    x_sharding = jax.tree.map(named, x_spec(mode, name), is_leaf=lambda s: isinstance(s, P))
    replicated = jax.tree.map(lambda _: named(P()), params)
    if explicit:
        fn = jax.jit(step)
        args = (
            jax.device_put(params, replicated),
            jax.device_put(x, x_sharding),
            jax.device_put(tangent, replicated),
        )
        with jax.set_mesh(mesh):
            return fn(*args), fn.lower(*args).compile().as_text()
    fn = jax.jit(step, in_shardings=(replicated, x_sharding, replicated))
    return fn(params, x, tangent), fn.lower(params, x, tangent).compile().as_text()


@functools.cache
def xla_program(mode, devices, name):
    """The compiled HLO text of the same program with the plain XLA reduction (the baseline)."""
    return compiled_figures(mode, devices, name, "xla")[1]


def assert_matches_naive(got, name):
    for ours, naive in zip(jax.tree.leaves(got), jax.tree.leaves(naive_figures(name)), strict=True):
        ours, naive = np.asarray(ours), np.asarray(naive)
        np.testing.assert_allclose(ours, naive, rtol=1e-5, atol=1e-5 * np.max(np.abs(naive)))


def refusal(mode, backend):
    """The ValueError a backend raises in a mode it cannot run in, or None where it runs.

    TPU interpret mode cannot enter custom_partitioning (host callbacks), so Auto-sharded jit
    refuses it; generic interpret mode cannot run inside shard_map(check_vma=True) (JAX 0.10.2).
    """
    if backend == "tpu-interpret" and mode.startswith("jit"):
        return "host callbacks.*explicit sharding.*'interpret'"
    if backend == "interpret" and mode == "shard_map":
        return "cannot run inside shard_map.*'tpu-interpret'"
    return None


# --- Value, gradients and HVP equal the naive penalty in every mode ------------------------------


@pytest.mark.parametrize("devices", [4, pytest.param(8, marks=pytest.mark.slow)])
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(CRITICS))
@pytest.mark.parametrize("backend", KERNEL_BACKENDS)
def test_kernel_equals_naive_and_adds_no_collective(backend, name, mode, devices):
    if refusal(mode, backend):
        with pytest.raises(ValueError, match=refusal(mode, backend)):
            compiled_figures(mode, devices, name, backend)
        return
    got, text = compiled_figures(mode, devices, name, backend)
    assert_matches_naive(got, name)
    xla_text = xla_program(mode, devices, name)
    assert arrays_moved(text, "all-gather") <= arrays_moved(xla_text, "all-gather")
    assert arrays_moved(text, "all-reduce") <= arrays_moved(xla_text, "all-reduce")
    if not mode.endswith("2d"):  # on 2-D meshes the critic's own layers may gather x
        assert arrays_moved(text, "all-gather") == 0


@pytest.mark.parametrize("mode", ["jit-2d", "explicit-2d"])
def test_gpu_interpret_partitions_like_the_tpu_kernels(mode):
    """The Triton kernel's interpret mode goes through the same partitioning (CPU stand-in for
    the CUDA program, whose partitioned compile needs a GPU)."""
    got, text = compiled_figures(mode, 8, "mlp", "gpu-interpret")
    assert_matches_naive(got, "mlp")
    xla_text = xla_program(mode, 8, "mlp")
    assert arrays_moved(text, "all-gather") <= arrays_moved(xla_text, "all-gather")
    assert arrays_moved(text, "all-reduce") <= arrays_moved(xla_text, "all-reduce")


# --- The partial sums' one all-reduce -----------------------------------------------------------


@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit])
@pytest.mark.parametrize(
    "spec,all_reduces",
    [
        (P("data"), 0),
        (P("data", "model"), 1),
        (P(None, None, "model"), 1),
        (P(), 0),
        (P(("data", "model")), 0),
    ],
)
def test_norms_need_one_all_reduce_exactly_when_a_reduced_axis_is_sharded(
    spec, all_reduces, axis_type
):
    g = jax.random.normal(jax.random.PRNGKey(1), (BATCH, 8, 6, 3))
    mesh = mesh_for("2d", 8, axis_type)
    sharded = jax.device_put(g, NamedSharding(mesh, spec))
    fn = jax.jit(functools.partial(penalty.grad_norms, backend="interpret"))
    with jax.set_mesh(mesh):
        text = fn.lower(sharded).compile().as_text()
        norms = fn(sharded)
    assert arrays_moved(text, "all-reduce") == all_reduces
    assert arrays_moved(text, "all-gather") == 0
    np.testing.assert_allclose(
        norms, np.sqrt(np.sum(np.asarray(g, np.float64) ** 2, (1, 2, 3))), rtol=1e-6
    )
    batch_spec = P(spec[0] if len(spec) else None)
    assert norms.sharding.is_equivalent_to(NamedSharding(mesh, batch_spec), 1)


# --- What cannot be partitioned says so ----------------------------------------------------------


def test_uneven_split_of_a_reduced_axis_is_an_error_naming_the_sharding():
    """JAX refuses uneven shards of arrays it places; the partitioner may still choose them for
    an intermediate (here through a sharding constraint), and the kernel would sum the padding."""
    g = jax.random.normal(jax.random.PRNGKey(2), (BATCH, 3, 8))
    mesh = Mesh(np.array(jax.devices()[:4]), ("model",))
    norms = lambda spec: jax.jit(
        lambda g: penalty.grad_norms(
            lax.with_sharding_constraint(g, NamedSharding(mesh, spec)), backend="interpret"
        )
    )(g)
    expected = np.sqrt(np.sum(np.asarray(g, np.float64) ** 2, axis=(1, 2)))
    np.testing.assert_allclose(norms(P(None, None, "model")), expected, rtol=1e-6)
    with pytest.raises(
        Exception,
        match=r"P\(None, 'model', None\).*dimension 1 \(size 3\) "
        r"over 4 devices unevenly",
    ):
        norms(P(None, "model"))


def test_ragged_batch_shards_are_exact():
    g = jax.random.normal(jax.random.PRNGKey(3), (6, 5, 8))
    mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
    norms = jax.jit(
        lambda g: penalty.grad_norms(
            lax.with_sharding_constraint(g, NamedSharding(mesh, P("data"))), backend="interpret"
        )
    )(g)
    np.testing.assert_allclose(
        norms, np.sqrt(np.sum(np.asarray(g, np.float64) ** 2, (1, 2))), rtol=1e-6
    )


def test_pallas_under_auto_sharding_names_the_missing_tpu_partitioner():
    """On TPU, custom_partitioning has no partitioner (jax-ml/jax#38196); the error says so and
    names explicit sharding and shard_map, where the kernel runs."""
    pytest.importorskip("jax.experimental.topologies")
    from fastgp._measure import compiled as cf

    mesh = Mesh(np.array(cf.tpu_devices("v5e:2x2")), ("data",))
    x = jax.ShapeDtypeStruct((BATCH, 12), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    w = jax.ShapeDtypeStruct((12,), jnp.float32, sharding=NamedSharding(mesh, P()))
    loss = lambda w, x: penalty.gradient_penalty(lambda y: jnp.tanh(y) @ w, x, backend="pallas")
    with pytest.raises(ValueError, match=r"38196.*explicit sharding.*shard_map"):
        jax.jit(jax.grad(loss)).lower(w, x)


def test_mixed_axis_types_are_an_error_naming_them():
    devs = np.array(jax.devices()[:4]).reshape(2, 2)
    mesh = Mesh(devs, ("data", "model"), axis_types=(AxisType.Explicit, AxisType.Auto))
    g = jax.device_put(jnp.ones((BATCH, 4)), NamedSharding(mesh, P("data")))
    with pytest.raises(ValueError, match=r"axis types.*Explicit.*Auto"), jax.set_mesh(mesh):
        penalty.grad_norms(g, backend="interpret")


@pytest.mark.parametrize("backend", ["interpret", "gpu-interpret"])
def test_vmapped_penalty_and_gradients_equal_each_batch_on_its_own(backend):
    """custom_partitioning has no batching rule; under jax.vmap the kernel backends reduce the
    stacked (V, B, ...) leaf as one (V * B, ...) batch."""
    apply, params, x, _ = problem("nhwc-conv")
    stack = jnp.stack([x, 2 * x, -x])
    loss = lambda p, x, fn: fn(functools.partial(apply, p), x)
    ours = jax.vmap(jax.value_and_grad(loss), in_axes=(None, 0, None))(
        params, stack, functools.partial(penalty.gradient_penalty, backend=backend)
    )
    for i, xi in enumerate(stack):
        naive = jax.value_and_grad(loss)(params, xi, reference.naive_gradient_penalty)
        for got, want in zip(jax.tree.leaves(ours), jax.tree.leaves(naive), strict=True):
            np.testing.assert_allclose(got[i], want, rtol=1e-5, atol=1e-5 * np.max(np.abs(want)))


GSPMD_SCRIPT = """
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_use_shardy_partitioner", False)
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from fastgp import penalty
mesh = Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))
g = jax.random.normal(jax.random.PRNGKey(1), (16, 8, 6, 3))
for spec, all_reduces in [(P("data"), 0), (P("data", "model"), 1), (P(), 0)]:
    fn = jax.jit(lambda g: penalty.grad_norms(g, backend="interpret"),
                 in_shardings=NamedSharding(mesh, spec))
    text = fn.lower(g).compile().as_text()
    assert text.count(" all-reduce(") == all_reduces and "all-gather" not in text, spec
    np.testing.assert_allclose(fn(g), np.sqrt(np.sum(np.asarray(g, np.float64) ** 2, (1, 2, 3))),
                               rtol=1e-6)
print("ok")
"""


def test_gspmd_callbacks_partition_like_the_shardy_rule():
    """With Shardy off, the GSPMD callbacks (infer_sharding_from_operands, partition) do it."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    run = subprocess.run(
        [sys.executable, "-c", GSPMD_SCRIPT], capture_output=True, text=True, timeout=300, env=env
    )
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-3000:]
