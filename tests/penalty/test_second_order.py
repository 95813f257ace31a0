"""The penalty's derivatives equal nested autodiff of the naive penalty, to third order.

Both second-order strategies (the default reverse-over-forward custom_vjp, and nested reverse
mode) and remat, on critics the library knows nothing about: an MLP, NHWC and NCHW convolutions
and a pytree input; every kind; inside shard_map on 4 devices. Exactness is asserted in float64
(``F64_RTOL``); the interpret kernel, which accumulates in float32, and bf16 critics in float32.
"""

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from fastgp import penalty
from fastgp._penalty import reference
from oracles import value_grad_hvp

KINDS = ["wgan-gp", "wgan-lp", "r1"]
# float64 rounding: every order below agrees with nested autodiff to ~1e-15 of its largest entry
# (float32 would give ~1e-7, and its reduction orders differ between CPUs); 1e-12 leaves 100x.
F64_RTOL = 1e-12


def _conv(x, w, layout):
    spec = ("NHWC", "HWIO", "NHWC") if layout == "NHWC" else ("NCHW", "OIHW", "NCHW")
    return lax.conv_general_dilated(x, w, (2, 2), "SAME", dimension_numbers=spec)


def conv_critic(layout):
    """Two stride-2 convolutions, leaky ReLU, a linear head: (B, 8, 8, 3) or (B, 3, 8, 8)."""

    def init(key, dtype):
        k1, k2, k3 = jax.random.split(key, 3)
        shape1, shape2 = (
            ((3, 3, 3, 8), (3, 3, 8, 8)) if layout == "NHWC" else ((8, 3, 3, 3), (8, 8, 3, 3))
        )
        return {
            "c1": jax.random.normal(k1, shape1, dtype) * 0.4,
            "c2": jax.random.normal(k2, shape2, dtype) * 0.2,
            "head": jax.random.normal(k3, (8 * 2 * 2,), dtype) * 0.3,
        }

    def apply(p, x):
        h = jax.nn.leaky_relu(_conv(x, p["c1"], layout), 0.2)
        h = jax.nn.leaky_relu(_conv(h, p["c2"], layout), 0.2)
        return h.reshape(h.shape[0], -1) @ p["head"]

    shape = (8, 8, 3) if layout == "NHWC" else (3, 8, 8)
    return init, apply, shape


def mlp_critic():
    def init(key, dtype):
        k1, k2 = jax.random.split(key)
        return {
            "w1": jax.random.normal(k1, (12, 16), dtype) * 0.8,
            "b1": jnp.zeros(16, dtype),
            "w2": jax.random.normal(k2, (16, 1), dtype) * 0.5,
        }

    def apply(p, x):
        return jnp.tanh(x @ p["w1"] + p["b1"]) @ p["w2"]  # (B, 1) scores

    return init, apply, (12,)


def pytree_critic():
    """x = {"img": (B, 2, 3), "vec": (B, 5)}: the norm runs over both leaves."""

    def init(key, dtype):
        k1, k2 = jax.random.split(key)
        return {
            "w": jax.random.normal(k1, (11, 8), dtype) * 0.7,
            "v": jax.random.normal(k2, (8,), dtype),
        }

    def apply(p, x):
        flat = jnp.concatenate([x["img"].reshape(x["img"].shape[0], -1), x["vec"]], axis=1)
        return jnp.sin(flat @ p["w"]) @ p["v"]

    return init, apply, {"img": (2, 3), "vec": (5,)}


CRITICS: dict[str, Callable[[], tuple]] = {
    "mlp": mlp_critic,
    "conv-nhwc": functools.partial(conv_critic, "NHWC"),
    "conv-nchw": functools.partial(conv_critic, "NCHW"),
    "pytree": pytree_critic,
}


def problem(name, batch=6, dtype=jnp.float32, seed=0):
    init, apply, shape = CRITICS[name]()
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    params = init(k1, dtype)
    x: dict | jax.Array
    if isinstance(shape, dict):
        keys = jax.random.split(k2, len(shape))
        x = {
            n: jax.random.normal(k, (batch,) + s, dtype)
            for k, (n, s) in zip(keys, shape.items(), strict=True)
        }
    else:
        x = jax.random.normal(k2, (batch,) + shape, dtype)
    return apply, params, x


def loss_fns(apply, x, kind, **options) -> tuple[Callable, Callable]:
    """(ours, naive): params -> penalty, with target 0.8 so samples fall on both sides of it."""
    ours = lambda p: penalty.gradient_penalty(
        functools.partial(apply, p), x, kind=kind, target=0.8, weight=3.0, **options
    )
    naive = lambda p: reference.naive_gradient_penalty(
        functools.partial(apply, p), x, kind=kind, target=0.8, weight=3.0
    )
    return ours, naive


def hvp(fn, params, tangent):
    """Hessian-vector product, forward-over-reverse."""
    return jax.jvp(jax.grad(fn), (params,), (tangent,))[1]


def third(fn, params, tangent):
    """grad_p <grad_p <grad_p fn, t>, t>: a third derivative contracted twice."""
    inner = lambda p: jnp.vdot(ravel(jax.grad(fn)(p)), ravel(tangent))
    outer = lambda p: jnp.vdot(ravel(jax.grad(inner)(p)), ravel(tangent))
    return jax.grad(outer)(params)


def ravel(tree):
    return jnp.concatenate([leaf.ravel() for leaf in jax.tree.leaves(tree)])


def assert_close(ours, ref, rtol):
    """Relative to the largest entry of the reference (so entries near 0 do not dominate)."""
    ours, ref = np.asarray(ravel(ours)), np.asarray(ravel(ref))
    scale = np.max(np.abs(ref))
    assert scale > 0, "the reference derivative is identically zero: nothing is being compared"
    np.testing.assert_allclose(ours, ref, rtol=0, atol=rtol * scale)


def orders(fn, params, tangent):
    """fn's value, gradient, HVP and contracted third derivative along ``tangent``."""
    return *value_grad_hvp(fn, params, tangent), third(fn, params, tangent)


def all_orders(fn, params, tangent):
    """:func:`orders`, as one compiled program."""
    return jax.jit(functools.partial(orders, fn))(params, tangent)


def check_all_orders(ours, naive, params, rtol):
    tangent = jax.tree.map(
        lambda p: jnp.cos(jnp.arange(p.size, dtype=p.dtype)).reshape(p.shape), params
    )
    (value, *derivatives), (want, *oracles) = (
        all_orders(f, params, tangent) for f in (ours, naive)
    )
    np.testing.assert_allclose(value, want, rtol=rtol)
    for got, oracle, tolerance in zip(derivatives, oracles, (rtol, rtol, 10 * rtol), strict=True):
        assert_close(got, oracle, tolerance)


@pytest.mark.parametrize("name", list(CRITICS))
@pytest.mark.parametrize("kind", KINDS)
def test_default_second_order_equals_naive_to_third_order(name, kind):
    with jax.enable_x64(True):
        apply, params, x = problem(name, dtype=jnp.float64)
        check_all_orders(*loss_fns(apply, x, kind, backend="xla"), params, rtol=F64_RTOL)


@pytest.mark.parametrize("second_order", penalty.SECOND_ORDER)
@pytest.mark.parametrize("remat", [None, "nothing", "dots"])
def test_every_strategy_and_remat_equals_naive(second_order, remat):
    with jax.enable_x64(True):
        apply, params, x = problem("conv-nhwc", dtype=jnp.float64)
        ours, naive = loss_fns(
            apply, x, "wgan-gp", backend="xla", second_order=second_order, remat=remat
        )
        check_all_orders(ours, naive, params, rtol=F64_RTOL)


@pytest.mark.parametrize("name", ["mlp", "conv-nchw"])
def test_float64_through_the_auto_backend_stays_float64(name):
    with jax.enable_x64(True):
        apply, params, x = problem(name, dtype=jnp.float64)
        ours, naive = loss_fns(apply, x, "wgan-gp", backend="auto")
        assert ours(params).dtype == jnp.float64
        check_all_orders(ours, naive, params, rtol=F64_RTOL)


def test_float64_with_a_kernel_backend_is_a_clear_error():
    with jax.enable_x64(True):
        apply, params, x = problem("mlp", dtype=jnp.float64)
        with pytest.raises(ValueError, match="float64"):
            penalty.gradient_penalty(functools.partial(apply, params), x, backend="interpret")


def test_through_the_interpret_kernel():
    """The kernel accumulates in float32 (float64 is refused): float32 against float32 nested
    autodiff, 2-3e-7 of the largest entry measured on AVX-512, AVX2 and SSE4.2 (the conv
    critic's third-order program is shallow); 1e-5 (1e-4 for the third order) leaves 30x."""
    apply, params, x = problem("conv-nhwc")
    check_all_orders(*loss_fns(apply, x, "wgan-lp", backend="interpret"), params, rtol=1e-5)


def test_gradient_in_x_equals_naive():
    """(A piecewise-linear conv critic's penalty is flat in x almost everywhere; tanh is not.)"""
    with jax.enable_x64(True):
        apply, params, x = problem("mlp", dtype=jnp.float64)
        ours = lambda y: penalty.gradient_penalty(functools.partial(apply, params), y)
        naive = lambda y: reference.naive_gradient_penalty(functools.partial(apply, params), y)
        assert_close(jax.grad(ours)(x), jax.grad(naive)(x), F64_RTOL)


def test_a_wrong_backward_would_be_caught():
    """The float64 comparison sees a backward off by 1e-10 (relative), a thousand times below
    float32's rounding."""
    with jax.enable_x64(True):
        apply, params, x = problem("mlp", dtype=jnp.float64)
        ours, naive = loss_fns(apply, x, "wgan-gp", backend="xla")
        assert_close(jax.grad(ours)(params), jax.grad(naive)(params), F64_RTOL)
        off = lambda p: ours(p) + 1e-10 * naive(p)
        with pytest.raises(AssertionError):
            assert_close(jax.grad(off)(params), jax.grad(naive)(params), F64_RTOL)


def test_bf16_critic_gives_float32_penalty_and_bf16_cotangents():
    apply, params, x = problem("conv-nhwc", dtype=jnp.bfloat16)
    value, grads = jax.value_and_grad(
        lambda p: penalty.gradient_penalty(functools.partial(apply, p), x)
    )(params)
    assert value.dtype == jnp.float32
    assert all(g.dtype == jnp.bfloat16 for g in jax.tree.leaves(grads))
    params32 = jax.tree.map(lambda p: p.astype(jnp.float32), params)
    ref = jax.grad(
        lambda p: reference.naive_gradient_penalty(
            functools.partial(apply, p), x.astype(jnp.float32)
        )
    )(params32)
    assert_close(jax.tree.map(lambda g: g.astype(jnp.float32), grads), ref, 0.05)


def test_zero_input_gradient_keeps_every_order_finite():
    """A dead ReLU critic: zero input-gradient for every sample (the naive path gives NaN)."""
    params = {"w": -jnp.ones((3, 4)), "v": jnp.ones((4,))}
    x = jnp.abs(jax.random.normal(jax.random.PRNGKey(0), (5, 3)))
    fn = lambda p: penalty.gradient_penalty(lambda y: jax.nn.relu(y @ p["w"]) @ p["v"], x)
    tangent = jax.tree.map(jnp.ones_like, params)
    for tree in (jax.grad(fn)(params), hvp(fn, params, tangent), third(fn, params, tangent)):
        assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(tree))


def test_forward_mode_of_the_penalty_itself_names_the_alternatives():
    apply, params, x = problem("mlp")
    fn = lambda p: penalty.gradient_penalty(functools.partial(apply, p), x)
    with pytest.raises(TypeError, match=r"fastgp.*second_order='reverse'"):
        jax.jvp(fn, (params,), (params,))
    with jax.enable_x64(True):
        apply, params, x = problem("mlp", dtype=jnp.float64)
        reverse = lambda p: penalty.gradient_penalty(
            functools.partial(apply, p), x, second_order="reverse"
        )
        naive = lambda p: reference.naive_gradient_penalty(functools.partial(apply, p), x)
        np.testing.assert_allclose(
            jax.jvp(reverse, (params,), (params,))[1],
            jax.jvp(naive, (params,), (params,))[1],
            rtol=F64_RTOL,
        )


@pytest.mark.parametrize("second_order", penalty.SECOND_ORDER)
def test_sharded_on_4_devices_equals_one_device_to_third_order(second_order):
    with jax.enable_x64(True):
        apply, params, x = problem("conv-nhwc", batch=8, dtype=jnp.float64)
        mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
        xs = jax.device_put(x, NamedSharding(mesh, P("data")))
        tangent = jax.tree.map(
            lambda p: jnp.cos(jnp.arange(p.size, dtype=p.dtype)).reshape(p.shape), params
        )

        def derivatives(p, y, t):
            fn = lambda q: penalty.gradient_penalty(
                functools.partial(apply, q),
                y,
                kind="wgan-lp",
                target=0.8,
                weight=3.0,
                axis_name="data",
                second_order=second_order,
            )
            return orders(fn, p, t)

        sharded = jax.jit(
            jax.shard_map(
                derivatives,
                mesh=mesh,
                in_specs=(P(), P("data"), P()),
                out_specs=P(),
                check_vma=True,
            )
        )
        ours = sharded(params, xs, tangent)
        want = all_orders(loss_fns(apply, x, "wgan-lp")[1], params, tangent)
        np.testing.assert_allclose(ours[0], want[0], rtol=F64_RTOL)
        for got, oracle, tolerance in zip(ours[1:], want[1:], (1, 1, 10), strict=True):
            assert_close(got, oracle, tolerance * F64_RTOL)


def test_unknown_options_raise():
    apply, params, x = problem("mlp")
    critic = functools.partial(apply, params)
    with pytest.raises(ValueError, match="second_order"):
        penalty.gradient_penalty(critic, x, second_order="sideways")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="remat"):
        penalty.gradient_penalty(critic, x, remat="everything")  # type: ignore[arg-type]
