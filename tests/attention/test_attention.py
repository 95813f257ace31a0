"""fastgp.attention equals plain jnp attention under nested autodiff, to third order.

Oracle: ``fastgp.naive_attention`` (every T_q x T_k array materialised, differentiated by JAX).
Every rule is exercised: the value, the VJP (first-order reverse), the JVP, both Hessian-vector
products (forward-over-reverse, reverse-over-reverse: the VJP of the VJP), forward-over-forward,
reverse-over-forward (the VJP of the JVP, the penalty's default), and a third derivative; over
ragged T, T_q != T_k, one and several heads, head dims 32/64/128, causal and key-padding masks,
several query and key blocks of the XLA loop, bf16 and vmap. The derivative set on every backend
of the op is tests/attention/test_attention_backends.py.

The derivative sets are compiled as one program each (``jax.jit``), as a training step takes
them; the bf16, vmap and transpose tests run eagerly, through each primitive's own dispatch.
"""

import functools
from collections.abc import Callable
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fastgp
from fastgp._attention import xla as blockwise
from fastgp._attention.config import Config

# float32 stays: fastgp.attention accumulates in float32 whatever its inputs, as its oracle does.
# The two differ by at most 1.5e-6 of the largest entry up to third order, within 20% on AVX-512,
# AVX2, SSE4.2 and one-threaded Eigen (one op deep): 1e-5 leaves 6x.
RTOL = 1e-5
BACKENDS = ["xla", "interpret"]


def rel_err(got, want):
    got, want = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(got) == len(want)
    return max(
        float(np.max(np.abs(np.asarray(g, np.float64) - np.asarray(w, np.float64))))
        / max(float(np.max(np.abs(np.asarray(w, np.float64)))), 1e-30)
        for g, w in zip(got, want, strict=True)
    )


def inputs(b, tq, tk, h, d, dtype=jnp.float32, seed=0, padding=False):
    ks = jax.random.split(jax.random.PRNGKey(seed), 8)
    q = jax.random.normal(ks[0], (b, tq, h, d), dtype)
    k = jax.random.normal(ks[1], (b, tk, h, d), dtype)
    v = jax.random.normal(ks[2], (b, tk, h, d), dtype)
    mask = None
    if padding:
        mask = jax.random.uniform(ks[3], (b, tk)) > 0.3
        mask = mask.at[:, 0].set(True)  # every query has a key (a row without one is tested apart)
    tangents = tuple(jax.random.normal(ks[4 + i], x.shape, dtype) for i, x in enumerate((q, k, v)))
    return (q, k, v), mask, tangents


def pair(mask, causal, backend):
    ours = lambda q, k, v: fastgp.attention(q, k, v, mask=mask, is_causal=causal, backend=backend)
    naive = lambda q, k, v: fastgp.naive_attention(q, k, v, mask=mask, is_causal=causal)
    return ours, naive


def scalar_loss(fn):
    return lambda q, k, v: jnp.sum(jnp.sin(fn(q, k, v)))


@functools.partial(jax.jit, static_argnums=0)
def derivatives(fn, args, tangents):
    """Every derivative the penalty and a user's nested autodiff take, as a dict of pytrees."""
    loss = scalar_loss(fn)
    grad = jax.grad(loss, argnums=(0, 1, 2))
    ct = jnp.cos(fn(*args))
    return {
        "value": fn(*args),
        "jvp": jax.jvp(fn, args, tangents)[1],
        "vjp": jax.vjp(fn, *args)[1](ct),
        "hvp forward-over-reverse": jax.jvp(grad, args, tangents)[1],
        "hvp reverse-over-reverse": jax.grad(
            lambda *a: sum(jnp.vdot(g, t) for g, t in zip(grad(*a), tangents, strict=True)),
            argnums=(0, 1, 2),
        )(*args),
        "forward-over-forward": jax.jvp(lambda *a: jax.jvp(fn, a, tangents)[1], args, tangents)[1],
        "reverse-over-forward": jax.grad(
            lambda *a: jnp.sum(jnp.sin(jax.jvp(fn, a, tangents)[1])), argnums=(0, 1, 2)
        )(*args),
        # with the direction differentiated too, as a penalty's backward does (its direction
        # moves with the critic's parameters)
        "forward-over-forward, direction too": jax.jvp(
            lambda a, t: jax.jvp(fn, a, t)[1], (args, tangents), (tangents, args)
        )[1],
        "reverse-over-forward, direction too": jax.grad(
            lambda a, t: jnp.sum(jnp.sin(jax.jvp(fn, a, t)[1])), argnums=(0, 1)
        )(args, tangents),
    }


CASES = [
    # b, tq, tk, h, d, causal, padding
    (2, 37, 53, 2, 32, False, True),  # ragged, T_q != T_k, key padding
    (1, 64, 64, 1, 64, True, False),  # one head, causal
    (2, 29, 29, 3, 128, True, True),  # head dim 128, causal and padding
    (1, 20, 700, 2, 32, False, False),  # more keys than one block of the XLA loop
]


# The cases that reach every masking path, which every backend runs
# (tests/attention/test_attention_backends.py); the others exercise the XLA loop's blocks.
BACKEND_CASES = [CASES[0], CASES[2]]
XLA_CASES = [c for c in CASES if c not in BACKEND_CASES]


def case_id(case):
    return "b{}-tq{}-tk{}-h{}-d{}-c{}-m{}".format(*case)


@pytest.mark.parametrize("case", XLA_CASES, ids=case_id)
def test_every_derivative_matches_nested_autodiff(case):
    b, tq, tk, h, d, causal, padding = case
    args, mask, tangents = inputs(b, tq, tk, h, d, padding=padding)
    ours, naive = pair(mask, causal, "xla")
    got, want = derivatives(ours, args, tangents), derivatives(naive, args, tangents)
    for name in want:
        assert rel_err(got[name], want[name]) < RTOL, name


def primitive_names(jaxpr) -> set[str]:
    """Every primitive in a jaxpr and in the jaxprs its equations hold (jit, scan, ...)."""
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    names |= primitive_names(inner)
    return names


def test_second_derivatives_on_kernels_are_attention_passes_alone():
    """With a kernel backend, the value and every first and second derivative (both HVPs,
    forward-over-forward, reverse-over-forward) bind fastgp's attention passes and no blockwise
    XLA loop: the second-order terms are the tangent_jvp, vjp_jvp and second_vjp passes, not
    JAX's JVP of a scan. (A third derivative falls back to those loops: test_third_derivative.)"""
    args, mask, tangents = inputs(*BACKEND_CASES[1][:5], padding=True)
    ours, _ = pair(mask, True, "interpret")
    jaxpr = jax.make_jaxpr(lambda a, t: derivatives(ours, a, t))(args, tangents)
    names = primitive_names(jaxpr.jaxpr)
    passes = {n for n in names if n.startswith("fastgp_attention_")}
    assert passes == {
        f"fastgp_attention_{p}"
        for p in ("forward", "tangent", "vjp", "tangent_jvp", "vjp_jvp", "second_vjp")
    }
    assert not names & {"scan", "while"}, names & {"scan", "while"}
    xla_jaxpr = jax.make_jaxpr(lambda a, t: derivatives(pair(mask, True, "xla")[0], a, t))
    assert primitive_names(xla_jaxpr(args, tangents).jaxpr) >= passes


@pytest.mark.parametrize("backend", BACKENDS)
def test_third_derivative(backend):
    args, mask, tangents = inputs(1, 9, 13, 2, 32, padding=True)

    def third(fn):
        loss = scalar_loss(fn)
        hvp = lambda q: jax.jvp(lambda y: jax.grad(loss)(y, *args[1:]), (q,), (tangents[0],))[1]
        return jax.jit(jax.grad(lambda q: jnp.vdot(hvp(q), tangents[0])))(args[0])

    ours, naive = pair(mask, True, backend)
    assert rel_err(third(ours), third(naive)) < 5 * RTOL  # four chained float32 passes


@pytest.mark.parametrize("backend", BACKENDS)
def test_bf16_inputs_against_float32(backend):
    args, mask, _ = inputs(2, 40, 48, 2, 64, jnp.bfloat16, padding=True)
    wide = tuple(x.astype(jnp.float32) for x in args)
    ours, _ = pair(mask, True, backend)
    _, naive = pair(mask, True, "xla")
    out = ours(*args)
    assert out.dtype == jnp.bfloat16
    assert rel_err(out, naive(*wide)) < 2e-2
    ct = jnp.ones(out.shape, jnp.bfloat16)
    grads = jax.vjp(ours, *args)[1](ct)
    assert all(g.dtype == jnp.bfloat16 for g in grads)
    assert rel_err(grads, jax.vjp(naive, *wide)[1](ct.astype(jnp.float32))) < 3e-2


@pytest.mark.parametrize("backend", BACKENDS)
def test_vmap_matches_the_batch(backend):
    args, mask, _ = inputs(3, 17, 19, 2, 32, padding=True)
    unmasked, unmasked_naive = pair(None, False, backend)
    one_each = jax.vmap(lambda q, k, v: unmasked(q[None], k[None], v[None])[0])
    assert rel_err(one_each(*args), unmasked_naive(*args)) < RTOL
    per_sample_mask: Callable[..., jax.Array] = jax.vmap(
        lambda q, k, v, m: fastgp.attention(
            q[None], k[None], v[None], mask=m[None], backend=backend
        )[0]
    )
    ours, naive = pair(mask, False, backend)
    assert rel_err(per_sample_mask(*args, mask), naive(*args)) < RTOL
    grad_in_vmap = jax.vmap(jax.grad(scalar_loss(ours)), in_axes=(0, None, None))
    want = jax.vmap(jax.grad(scalar_loss(naive)), in_axes=(0, None, None))
    many_q = jnp.stack([args[0], 2 * args[0]])
    assert rel_err(grad_in_vmap(many_q, *args[1:]), want(many_q, *args[1:])) < RTOL


@functools.partial(jax.jit, static_argnums=0)
def value_and_grads(fn, args):
    """fn(*args) and the gradient of ``scalar_loss(fn)`` in q, k and v, as one program."""
    return fn(*args), jax.grad(scalar_loss(fn), argnums=(0, 1, 2))(*args)


def test_causal_rows_of_every_query_block_see_their_own_keys():
    """T_q = T_k = 600 is two blocks of 512 queries in the XLA loop: the causal mask of the second
    block starts at its own first query, in the value and in the gradients."""
    args, mask, _ = inputs(1, 600, 600, 1, 16, padding=True)
    ours, naive = pair(mask, True, "xla")
    got, want = value_and_grads(ours, args), value_and_grads(naive, args)
    assert rel_err(got[0], want[0]) < RTOL, "value"
    assert rel_err(got[1], want[1]) < RTOL, "gradients"


BF16_TOL = 1.5e-2  # the rounding of bf16 outputs; a bf16 log-sum-exp moves the gradients 2x more


@pytest.mark.parametrize("backend", BACKENDS)
def test_bf16_equals_float32_on_the_same_values(backend):
    """bf16 q, k, v give the float32 result on the same (bf16) values but for the rounding of
    the outputs: the softmax statistics the backward passes read stay float32. Scores of several
    units (scale 2) make the log-sum-exp large, where bf16's step is coarse."""
    args, mask, _ = inputs(2, 40, 48, 2, 16, jnp.bfloat16, padding=True)
    wide = tuple(x.astype(jnp.float32) for x in args)
    ct = jax.random.normal(jax.random.PRNGKey(9), args[0].shape, jnp.bfloat16)
    ours = lambda q, k, v: fastgp.attention(
        q, k, v, scale=2.0, mask=mask, is_causal=True, backend=backend
    )
    naive = lambda q, k, v: fastgp.naive_attention(q, k, v, scale=2.0, mask=mask, is_causal=True)

    def value_and_vjp(fn):
        def run(q, k, v):
            out, back = jax.vjp(fn, q, k, v)
            return out, back(ct.astype(out.dtype))

        return jax.jit(run)

    out, grads = value_and_vjp(ours)(*args)
    assert out.dtype == jnp.bfloat16 and all(g.dtype == jnp.bfloat16 for g in grads)
    for reference in (ours, naive):  # fastgp's own float32 path, and the oracle
        want_out, want_grads = value_and_vjp(reference)(*wide)
        assert rel_err(out, want_out) < BF16_TOL
        for name, g, w in zip("qkv", grads, want_grads, strict=True):
            assert rel_err(g, w) < BF16_TOL, f"gradient in {name}"


def test_vmap_of_per_sample_masks_over_a_batch_equals_a_loop():
    """vmap over E = 2 problems, each a batch of B = 3 with its own key-padding masks: the value
    and the gradients equal a loop over the mapped axis (each mapped element keeps its own batch
    elements, masks and outputs)."""
    e, b, tk = 2, 3, 19
    args, _, _ = inputs(e * b, 17, tk, 2, 16)
    args = tuple(x.reshape(e, b, *x.shape[1:]) for x in args)
    masks = jax.random.uniform(jax.random.PRNGKey(5), (e, b, tk)) > 0.4
    masks = masks.at[..., 0].set(True)

    def one(q, k, v, m):
        fn = lambda q, k, v: fastgp.attention(q, k, v, mask=m, is_causal=True, backend="xla")
        return fn(q, k, v), jax.grad(scalar_loss(fn), argnums=(0, 1, 2))(q, k, v)

    mapped = jax.jit(jax.vmap(one))(*args, masks)
    single = jax.jit(one)
    for i in range(e):
        want = single(*(x[i] for x in args), masks[i])
        got = jax.tree.map(lambda x, i=i: x[i], mapped)
        assert rel_err(got, want) < RTOL, f"mapped element {i}"


def test_a_query_with_no_key_gets_zeros_and_finite_derivatives():
    args, _, tangents = inputs(2, 8, 8, 1, 32)
    mask = jnp.ones((2, 8), bool).at[1].set(False)
    ours, naive = pair(mask, False, "xla")
    out = ours(*args)
    assert np.all(np.asarray(out[1]) == 0)
    got, want = derivatives(ours, args, tangents), derivatives(naive, args, tangents)
    for name in want:
        assert np.all(np.isfinite(np.asarray(jax.tree.leaves(got[name])[0])))
        assert rel_err(got[name], want[name]) < RTOL, name


def test_blockwise_memory_is_linear_in_the_sequence():
    """The compiled second-order step through fastgp.attention holds no T x T array: its
    temporaries double when T doubles, where plain jnp attention's quadruple."""

    def temp_bytes(att, t):
        h, d = 2, 32

        def critic(w, x):
            qkv = (x @ w).reshape(*x.shape[:2], 3, h, d)
            return jnp.mean(att(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]), axis=(1, 2, 3))

        w = jnp.ones((16, 3 * h * d)) * 0.01
        x = jax.ShapeDtypeStruct((2, t, 16), jnp.float32)
        step = jax.jit(jax.grad(lambda w, x: fastgp.gradient_penalty(lambda y: critic(w, y), x)))
        return cast(Any, step.lower(w, x).compile().memory_analysis()).temp_size_in_bytes

    ours = lambda q, k, v: fastgp.attention(q, k, v, backend="xla")
    ratio_ours = temp_bytes(ours, 4096) / temp_bytes(ours, 2048)
    ratio_naive = temp_bytes(fastgp.naive_attention, 2048) / temp_bytes(
        fastgp.naive_attention, 1024
    )
    assert ratio_ours < 2.3, ratio_ours
    assert ratio_naive > 3.5, ratio_naive  # the yardstick: T x T arrays do quadruple


def test_bad_inputs_name_the_problem():
    q = jnp.ones((2, 8, 2, 16))
    with pytest.raises(ValueError, match="batch, tokens, heads, head_dim"):
        fastgp.attention(q[0], q, q)
    with pytest.raises(ValueError, match="share a dtype"):
        fastgp.attention(q, q.astype(jnp.bfloat16), q)
    for empty in ((2, 0, 2, 16), (2, 8, 0, 16), (2, 8, 2, 0)):
        with pytest.raises(ValueError, match="empty tokens, heads or head dims"):
            fastgp.attention(jnp.ones(empty), jnp.ones(empty), q)
    with pytest.raises(ValueError, match="not a key-padding mask"):
        fastgp.attention(q, q, q, mask=jnp.ones((2, 1, 8, 8), bool))
    with pytest.raises(ValueError, match="boolean"):
        fastgp.attention(q, q, q, mask=jnp.ones((2, 8)))
    with pytest.raises(ValueError, match="unknown backend"):
        fastgp.attention(q, q, q, backend="cuda")
    with pytest.raises(ValueError, match="dropout"):
        fastgp.attention(q, q, q, dropout_rate=0.1, deterministic=False)
    with pytest.raises(TypeError, match="unexpected keyword"):
        fastgp.attention(q, q, q, window=4)  # type: ignore[call-arg]


def test_blockwise_passes_are_each_others_transposes():
    """⟨tangent(ẋ), ȳ⟩ = ⟨ẋ, vjp(ȳ)⟩ for the blockwise passes (the closure the rules rely on)."""
    ks = jax.random.split(jax.random.PRNGKey(3), 8)
    q, k, v = (jax.random.normal(ks[i], (1, 2, 16 if i == 0 else 24, 8)) for i in range(3))
    mask = jnp.arange(24)[None] < 20
    config = Config(scale=0.4, causal=True, block_q=8, block_k=8)
    o, lse = blockwise.forward(q, k, v, mask, config=config)
    dots = [jax.random.normal(ks[3 + i], x.shape) for i, x in enumerate((q, k, v))]
    g_o, g_lse = jax.random.normal(ks[6], o.shape), jax.random.normal(ks[7], lse.shape)
    do, dlse = blockwise.tangent(q, k, v, o, lse, mask, *dots, config=config)
    back = blockwise.vjp(q, k, v, o, lse, mask, g_o, g_lse, config=config)
    lhs = jnp.vdot(do, g_o) + jnp.vdot(dlse, g_lse)
    rhs = sum(jnp.vdot(a, b) for a, b in zip(dots, back, strict=True))
    np.testing.assert_allclose(lhs, rhs, rtol=1e-5)


def _mesh(axis_type):
    from jax.sharding import AxisType

    kind = {"auto": AxisType.Auto, "explicit": AxisType.Explicit}[axis_type]
    devices = np.array(jax.devices()[:4]).reshape(2, 2)
    return jax.sharding.Mesh(devices, ("data", "model"), axis_types=(kind, kind))


BTHD = jax.sharding.PartitionSpec("data", None, "model", None)  # batch over data, heads over model


@pytest.mark.parametrize(
    "backend, mode",
    [
        ("xla", "auto"),
        ("xla", "explicit"),
        ("xla", "shard_map"),
        ("interpret", "explicit"),
        ("interpret", "shard_map"),
    ],
)
def test_each_device_runs_its_batch_and_heads(backend, mode):
    """Value and gradients on a 2 x 2 (data, model) mesh equal the single-device ones."""
    from jax.sharding import NamedSharding

    args, mask, _ = inputs(4, 24, 40, 2, 32, padding=True)
    # a replicated mask follows q's batch sharding; inside shard_map a global one cannot be closed
    # over (each shard holds its own samples)
    mask = None if mode == "shard_map" else mask
    ours = lambda q, k, v: fastgp.attention(q, k, v, mask=mask, is_causal=True, backend=backend)
    loss = scalar_loss(ours)
    want = (ours(*args), jax.grad(loss, argnums=(0, 1, 2))(*args))
    mesh = _mesh("auto" if mode == "shard_map" else mode)
    placed = [jax.device_put(x, NamedSharding(mesh, BTHD)) for x in args]
    if mode == "shard_map":
        fn = jax.shard_map(ours, mesh=mesh, in_specs=(BTHD,) * 3, out_specs=BTHD)
        loss = jax.shard_map(
            lambda *a: jax.lax.psum(scalar_loss(ours)(*a), ("data", "model")),
            mesh=mesh,
            in_specs=(BTHD,) * 3,
            out_specs=jax.sharding.PartitionSpec(),
        )
    else:
        fn = ours
    got = (jax.jit(fn)(*placed), jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(*placed))
    assert rel_err(got, want) < RTOL
    assert got[0].sharding.spec == BTHD


def test_kernels_refuse_an_auto_sharded_program_over_several_devices():
    from jax.sharding import NamedSharding

    args, _, _ = inputs(4, 16, 16, 2, 32)
    placed = [jax.device_put(x, NamedSharding(_mesh("auto"), BTHD)) for x in args]
    with pytest.raises(ValueError, match=r"explicit sharding .* or inside shard_map"):
        jax.jit(lambda q, k, v: fastgp.attention(q, k, v, backend="interpret"))(*placed)


def test_a_sharded_feature_axis_is_refused_with_the_tokens_split():
    """A sharded token axis runs sequence-parallel (tests/attention/test_sequence_parallel.py);
    a feature axis split with it is refused by name."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    args, _, _ = inputs(4, 16, 16, 2, 32)
    mesh = _mesh("explicit")
    placed = [jax.device_put(x, NamedSharding(mesh, P(None, "model"))) for x in args]
    placed[0] = jax.device_put(args[0], NamedSharding(mesh, P(None, "model", None, "data")))
    with pytest.raises(ValueError, match="feature axis is sharded"):
        jax.jit(lambda q, k, v: fastgp.attention(q, k, v, backend="interpret"))(*placed)


def test_pallas_off_tpu_and_gpu_names_the_alternatives():
    q = jnp.ones((1, 8, 1, 32))
    with pytest.raises(ValueError, match=r"TPU \(Mosaic\) and GPU \(Triton\).*'gpu-interpret'"):
        jax.jit(lambda q: fastgp.attention(q, q, q, backend="pallas")).lower(q).compile()
