"""Gradient penalties through a transformer critic that uses fastgp.attention.

The oracle is the float64 truth: the naive penalty (nested ``jax.grad``) of the same critic in
float64 with plain attention in float64 (``oracles.attention64``): value, parameter gradients and
a Hessian-vector product in the parameters, for every kind and both second orders (compiled as
one program, as a training step is), remat (run eagerly), and an ensemble of critics under
``vmap`` whose blocks run under ``lax.scan``. The critic under test runs in float64 too, so that
fastgp.attention's float32 accumulation is the only rounding (``ATTENTION_TOL``); one float32 run
holds the whole float32 program to float32's own error (``FLOAT32_TOL``). A critic holding an op
without forward mode gets an error that names the ways out.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fastgp
import oracles

KINDS = ["wgan-gp", "wgan-lp", "r1"]
HEADS, HEAD_DIM, WIDTH, TOKENS, PATCH = 2, 32, 32, 24, 6


def init(key):
    ks = jax.random.split(key, 6)
    n = lambda k, shape, s: jax.random.normal(k, shape, jnp.float32) * s
    return {
        "embed": n(ks[0], (PATCH, WIDTH), 0.5),
        "qkv": n(ks[1], (WIDTH, 3 * HEADS * HEAD_DIM), 0.3),
        "out": n(ks[2], (HEADS * HEAD_DIM, WIDTH), 0.2),
        "mlp": n(ks[3], (WIDTH, WIDTH), 0.3),
        "head": n(ks[4], (WIDTH,), 0.5),
    }


def layer_norm(h):
    mean = jnp.mean(h, -1, keepdims=True)
    return (h - mean) * jax.lax.rsqrt(jnp.var(h, -1, keepdims=True) + 1e-5)


def block(attention, weights, h):
    """A pre-LN transformer block (its "qkv", "out" and "mlp" weights) on (B, TOKENS, WIDTH)."""
    qkv = (layer_norm(h) @ weights["qkv"]).reshape(*h.shape[:2], 3, HEADS, HEAD_DIM)
    a = attention(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2])
    h = h + a.reshape(*h.shape[:2], -1) @ weights["out"]
    return h + jax.nn.gelu(layer_norm(h) @ weights["mlp"])


def critic(attention, params, x):
    """One block on (B, TOKENS, PATCH) inputs -> (B,) scores."""
    h = block(attention, params, x @ params["embed"])
    return jnp.mean(h, axis=1) @ params["head"]


def ours(backend, causal=False):
    return functools.partial(fastgp.attention, backend=backend, is_causal=causal)


def naive(causal=False):
    return functools.partial(fastgp.naive_attention, is_causal=causal)


def rel_err(got, want):
    return max(
        float(
            np.max(np.abs(np.asarray(g) - np.asarray(w))) / (np.max(np.abs(np.asarray(w))) + 1e-30)
        )
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True)
    )


def penalty_fn(attention, penalty, **kw):
    return lambda p, x: penalty(lambda y: critic(attention, p, y), x, **kw)


def value_grad_hvp(loss, params, x, direction):
    """The loss, its parameter gradients and the HVP along ``direction``."""
    return oracles.value_grad_hvp(lambda p: loss(p, x), params, direction)


compiled_value_grad_hvp = jax.jit(value_grad_hvp, static_argnums=0)


def data():
    """float32 parameters, inputs and direction (the same values under x64)."""
    key = jax.random.PRNGKey(1)
    params = init(key)
    x = jax.random.normal(jax.random.PRNGKey(2), (3, TOKENS, PATCH), jnp.float32)
    direction = jax.tree.map(lambda a: jnp.cos(a * 7.0), params)
    return params, x, direction


def options(kind):
    return dict(kind=kind, target=1.0 if kind != "wgan-lp" else 0.5)


# The float64 critic around fastgp.attention rounds only in the attention's float32 accumulation,
# ~1e-7 relative in its outputs: 4e-7 to 2.1e-6 of the largest entry here (the remat HVP), the
# same to 10% on AVX-512, AVX2, AVX and SSE4.2, one- and many-threaded Eigen: 1e-5 leaves 5x.
ATTENTION_TOL = 1e-5


@functools.cache
def truth(kind, causal=False):
    """The float64 truth: (value, gradients, HVP) of the naive penalty of the float64 critic with
    float64 attention, at ``data()`` cast to float64; once per kind."""
    with jax.enable_x64(True):
        loss = penalty_fn(
            functools.partial(oracles.attention64, is_causal=causal),
            fastgp.naive_gradient_penalty,
            **options(kind),
        )
        return jax.tree.map(np.asarray, compiled_value_grad_hvp(loss, *oracles.to64(data())))


def assert_near_truth(got, kind, causal=False, tol=ATTENTION_TOL):
    for name, g, w in zip(("value", "grads", "hvp"), got, truth(kind, causal), strict=True):
        error = rel_err(g, w)
        assert error < tol, (name, error)


def _case(kind, second_order, backend):
    """make check runs every kind on XLA and WGAN-GP on the TPU kernels; make test the rest (the
    GPU kernels' derivatives run in make check in test_attention_backends.py)."""
    slow = backend == "gpu-interpret" or (backend != "xla" and kind != "wgan-gp")
    return pytest.param(kind, second_order, backend, marks=[pytest.mark.slow] if slow else [])


@pytest.mark.parametrize(
    "kind, second_order, backend",
    [
        _case(k, s, b)
        for b in ("xla", "interpret", "gpu-interpret")
        for k in KINDS
        for s in ("reverse-over-forward", "reverse")
    ],
)
def test_penalty_through_attention_equals_naive(kind, second_order, backend):
    with jax.enable_x64(True):
        loss = penalty_fn(
            ours(backend), fastgp.gradient_penalty, second_order=second_order, **options(kind)
        )
        got = compiled_value_grad_hvp(loss, *oracles.to64(data()))
    assert_near_truth(got, kind)


# A float32 program against the float64 truth: float32 nested autodiff of the naive critic is
# itself up to 1.3e-5 off the one-block HVP and 1.75e-5 off the two-block gradients (the same
# within 10% on every ISA and Eigen threading measured; the tests assert it too), fastgp as much:
# 5e-5 leaves 2.9x, and still sees gradients scaled by 1.0001.
FLOAT32_TOL = 5e-5


def test_float32_penalty_through_attention_is_as_accurate_as_float32_autodiff():
    params, x, direction = data()
    for critic_attention, penalty in (
        (ours("xla", causal=True), fastgp.gradient_penalty),
        (naive(causal=True), fastgp.naive_gradient_penalty),
    ):
        got = compiled_value_grad_hvp(penalty_fn(critic_attention, penalty), params, x, direction)
        assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(got))
        assert_near_truth(got, "wgan-gp", causal=True, tol=FLOAT32_TOL)


def scanned_critic(attention, params, x):
    """Blocks run by ``lax.scan`` over their stacked weights (as deep critics are)."""
    step = lambda h, weights: (block(attention, weights, h), None)
    h, _ = jax.lax.scan(step, x @ params["embed"], params["blocks"])
    return jnp.mean(h, axis=1) @ params["head"]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["xla", "interpret"])
def test_an_ensemble_of_scanned_critics_under_vmap_equals_naive(backend):
    """Two critics (vmap over their parameters), each scanning two causal blocks: the penalty and
    its parameter gradients equal the naive penalty's, critic by critic."""
    params, x, _ = data()
    blocks = {k: jnp.stack([params[k], 0.8 * params[k]]) for k in ("qkv", "out", "mlp")}
    one = {"embed": params["embed"], "head": params["head"], "blocks": blocks}
    ensemble = jax.tree.map(lambda a: jnp.stack([a, jnp.flip(a, -1)]), one)

    def loss(attention, penalty, x):
        return lambda p: penalty(lambda y: scanned_critic(attention, p, y), x)

    want = []
    with jax.enable_x64(True):
        attention64 = functools.partial(oracles.attention64, is_causal=True)
        ensemble64, x64 = oracles.to64((ensemble, x))
        oracle = jax.jit(jax.value_and_grad(loss(attention64, fastgp.naive_gradient_penalty, x64)))
        for i in range(2):
            want.append(oracle(jax.tree.map(lambda a, i=i: a[i], ensemble64)))
    # The TPU kernels' causal block maps do not trace under x64 (lax.div of the int32 grid index
    # by an int64 offset, kernels/attention/layout.py): their run stays float32.
    in_float64 = backend == "xla"
    tol = ATTENTION_TOL if in_float64 else FLOAT32_TOL
    with jax.enable_x64(in_float64):
        critics, inputs = oracles.to64((ensemble, x)) if in_float64 else (ensemble, x)
        got = jax.vmap(
            jax.value_and_grad(loss(ours(backend, True), fastgp.gradient_penalty, inputs))
        )
        values, grads = jax.jit(got)(critics)
    for i in range(2):
        assert rel_err(values[i], want[i][0]) < tol
        assert rel_err(jax.tree.map(lambda a, i=i: a[i], grads), want[i][1]) < tol


@pytest.mark.slow  # a third-order program through remat and attention
@pytest.mark.parametrize("remat", ["nothing", "dots"])
def test_penalty_through_causal_attention_with_remat(remat):
    with jax.enable_x64(True):
        loss = penalty_fn(ours("xla", causal=True), fastgp.gradient_penalty, remat=remat)
        got = value_grad_hvp(loss, *oracles.to64(data()))
    assert_near_truth(got, "wgan-gp", causal=True)


@jax.custom_vjp
def fused_tanh(x):
    return jnp.tanh(x)


fused_tanh.defvjp(lambda x: (jnp.tanh(x), x), lambda x, g: (g * (1 - jnp.tanh(x) ** 2),))


def test_an_op_without_forward_mode_gets_an_error_naming_the_ways_out():
    params, x, _ = data()
    loss = lambda p, x: fastgp.gradient_penalty(lambda y: fused_tanh(y @ p["embed"]).sum((1, 2)), x)
    with pytest.raises(NotImplementedError, match="without forward mode") as err:
        jax.grad(loss)(params, x)
    for way_out in ("second_order='reverse'", "fastgp.attention", "fastgp.approximate_r1"):
        assert way_out in str(err.value)
    assert isinstance(err.value, fastgp.FirstOrderOnlyOpError)
    # the reverse second order takes it, since this op's backward is plain jnp
    reverse = lambda p, x: fastgp.gradient_penalty(
        lambda y: fused_tanh(y @ p["embed"]).sum((1, 2)), x, second_order="reverse"
    )
    assert np.isfinite(jax.grad(reverse)(params, x)["embed"]).all()


def test_jax_pallas_flash_attention_in_a_critic_gets_the_error_too():
    """JAX's own Pallas TPU flash attention (a custom_vjp with a kernel backward): neither second
    order can be taken through it, and both say so by name."""
    from jax.experimental.pallas.ops.tpu import flash_attention as jax_flash

    params, _, _ = data()
    x = jax.random.normal(jax.random.PRNGKey(3), (2, 128, PATCH))  # its smallest block is 128

    def pallas_attention(q, k, v):
        to_bhtd = lambda t: jnp.swapaxes(t, 1, 2)
        blocks = jax_flash.BlockSizes(
            **{f: (1 if f == "block_b" else 128) for f in jax_flash.BlockSizes.__dataclass_fields__}
        )
        o = jax_flash.flash_attention(
            *(to_bhtd(t) for t in (q, k, v)), sm_scale=HEAD_DIM**-0.5, block_sizes=blocks
        )
        return jnp.swapaxes(o, 1, 2)

    for second_order in ("reverse-over-forward", "reverse"):
        loss = penalty_fn(pallas_attention, fastgp.gradient_penalty, second_order=second_order)
        with pytest.raises(fastgp.FirstOrderOnlyOpError, match=r"fastgp\.attention"):
            jax.eval_shape(jax.grad(loss), params, x)


@pytest.mark.parametrize("backend", ["xla"])
def test_penalty_through_attention_in_shard_map_equals_one_device(backend):
    """Batch over 4 devices with axis_name: the global-batch penalty and its parameter
    gradients equal the single-device computation. (Pallas's generic interpret mode cannot run
    inside a check_vma shard_map whose kernel operands mix replicated and sharded values, in JAX
    0.10.2; the kernels' own shard_map runs are in tests/attention/test_attention.py.)"""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    params, _, _ = data()
    x = jax.random.normal(jax.random.PRNGKey(5), (8, TOKENS, PATCH), jnp.float32)
    mesh = jax.make_mesh((4,), ("data",), axis_types=(jax.sharding.AxisType.Explicit,))
    loss = penalty_fn(ours(backend), fastgp.gradient_penalty)

    def sharded(p, x):
        return jax.shard_map(
            lambda p, x: fastgp.gradient_penalty(
                lambda y: critic(ours(backend), p, y), x, axis_name="data"
            ),
            mesh=mesh,
            in_specs=(P(), P("data")),
            out_specs=P(),
        )(p, x)

    with jax.enable_x64(True):
        params, x = oracles.to64((params, x))
        want = jax.jit(jax.value_and_grad(loss))(params, x)
        placed = jax.device_put(x, NamedSharding(mesh, P("data")))
        got = jax.jit(jax.value_and_grad(sharded))(params, placed)
    assert rel_err(got, want) < ATTENTION_TOL  # the attention's float32 rounding: 4e-7 measured


def test_autotune_lists_the_attention_backends_when_the_critic_uses_fastgp_attention():
    from fastgp import autotune

    params, x, _ = data()

    def critic_loss(p, x, penalty):
        return penalty(lambda y: critic(fastgp.attention, p, y), x)

    assert autotune.uses_attention(critic_loss, params, (x,))
    assert not autotune.uses_attention(
        lambda p, x, penalty: penalty(lambda y: critic(naive(), p, y), x), params, (x,)
    )
    for platform in ("tpu", "gpu"):
        kernels = {v.attention for v in autotune.candidates(platform, attention=True)}
        assert kernels == {"xla", "pallas"}
    assert {v.attention for v in autotune.candidates("cpu", attention=True)} == {"xla"}
    assert {v.attention for v in autotune.candidates("cpu", attention=False)} == {None}
    variants = [autotune.Variant(attention="xla"), autotune.Variant(attention="interpret")]
    tuning = autotune.autotune(critic_loss, params, x, variants=variants, rounds=2, warmup=1)
    assert tuning.attention in ("xla", "interpret")
    assert all(r.problem is None for r in tuning.results), tuning.table()
    assert "attention=interpret" in tuning.table()


def test_attention_backend_sets_what_auto_means():
    q = jax.random.normal(jax.random.PRNGKey(0), (1, 8, 1, 32))
    # fresh functions: a function already traced keeps the backend it was traced with
    with fastgp.attention_backend("interpret"):
        text = str(jax.make_jaxpr(lambda *a: fastgp.attention(*a))(q, q, q))
    assert "backend='interpret'" in text
    assert "backend='xla'" in str(jax.make_jaxpr(lambda *a: fastgp.attention(*a))(q, q, q))
    with pytest.raises(ValueError, match=r"fastgp\.attention: unknown backend 'cuda'"):
        fastgp.attention_backend("cuda").__enter__()
