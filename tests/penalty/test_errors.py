"""Bad input gets an error that names the problem."""

import functools

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

import fastgp
from fastgp import penalty
from fastgp._penalty import reference

KEY = jax.random.PRNGKey(0)
critic = lambda x: jnp.sum(x, axis=1)


@pytest.mark.parametrize(
    "real,fake,error,match",
    [
        (jnp.zeros((4, 3)), jnp.zeros((4, 2)), ValueError, r"real has shape \(4, 3\) but fake"),
        (jnp.zeros((4, 3)), jnp.zeros((5, 3)), ValueError, "shape"),
        ({"a": jnp.zeros((4, 3))}, {"b": jnp.zeros((4, 3))}, ValueError, "different structures"),
        (jnp.zeros((4, 3)), jnp.zeros((4, 3), jnp.bfloat16), TypeError, "dtype"),
        (jnp.zeros((4, 3), jnp.int32), jnp.zeros((4, 3), jnp.int32), TypeError, "floating dtype"),
        (jnp.zeros((0, 3)), jnp.zeros((0, 3)), ValueError, "batch size 0"),
        (
            {"a": jnp.zeros((4, 3)), "b": jnp.zeros((5, 3))},
            {"a": jnp.zeros((4, 3)), "b": jnp.zeros((5, 3))},
            ValueError,
            "share the leading batch",
        ),
    ],
)
def test_interpolate_rejects_mismatched_inputs(real, fake, error, match):
    with pytest.raises(error, match=match):
        penalty.interpolate(KEY, real, fake)


@pytest.mark.parametrize(
    "grads,error,match",
    [
        (jnp.zeros((0, 3)), ValueError, "batch size 0"),
        (jnp.zeros((3,), jnp.int32), TypeError, "floating dtype"),
        (jnp.float32(1.0), ValueError, "scalar"),
        ([jnp.zeros((4, 3)), jnp.zeros((2, 3))], ValueError, r"grads\[1\] has batch size 2"),
        ([], ValueError, "empty pytree"),
        (jnp.zeros((4, 0)), ValueError, "no features"),
    ],
)
def test_grad_norms_rejects_bad_gradients(grads, error, match):
    with pytest.raises(error, match=match):
        penalty.grad_norms(grads)


@pytest.mark.parametrize(
    "bad_critic,match",
    [
        (lambda x: x, r"shape \(4,\) or \(4, 1\).*got \(4, 3\)"),
        (lambda x: jnp.sum(x), r"got \(\)"),
        (lambda x: jnp.sum(x, axis=1)[:2], r"got \(2,\)"),
        (lambda x: {"score": jnp.sum(x, axis=1)}, r"an array of scores .* got a dict"),
        (
            lambda x: jnp.tanh(x)[:, :, None] * jnp.ones((4, 3, 5)),  # a patch critic
            r"got \(4, 3, 5\): several scores per sample .* critic\(x\)\.sum\(axis=\(1, 2\)\)",
        ),
    ],
)
def test_critic_output_must_be_per_sample(bad_critic, match):
    with pytest.raises(ValueError, match=match):
        penalty.gradient_penalty(bad_critic, jnp.ones((4, 3)))


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"target": 0.0}, ValueError, "target must be finite and > 0"),
        ({"target": -1.0}, ValueError, "target"),
        ({"target": float("inf")}, ValueError, "target"),
        ({"target": jnp.float32(1.0)}, TypeError, "static Python number"),
        ({"weight": float("nan")}, ValueError, "weight must be finite"),
        ({"weight": float("inf")}, ValueError, "weight"),
        ({"kind": "wgan"}, ValueError, "unknown penalty kind 'wgan'"),
        ({"kind": "r2"}, ValueError, "R2 is the R1 penalty taken at the fakes: kind='r1'"),
        ({"kind": "WGAN-GP"}, ValueError, "kinds are lower case: 'wgan-gp'"),
        ({"backend": "cuda"}, ValueError, "unknown backend 'cuda'"),
    ],
)
def test_bad_options_are_named(kwargs, error, match):
    with pytest.raises(error, match=match):
        penalty.gradient_penalty(critic, jnp.ones((4, 3)), **kwargs)


def test_integer_labels_in_x_name_the_leaf_and_the_way_out():
    x = (jnp.ones((4, 3)), jnp.arange(4))
    with pytest.raises(TypeError, match=r"x\[1\] has dtype int32.*closing over them in the critic"):
        penalty.gradient_penalty(lambda xs: xs[0].sum(-1) + xs[1], x)


def test_traced_weight_is_allowed():
    value = jax.jit(
        lambda w: penalty.gradient_penalty(critic, jnp.ones((1, 4)), weight=w, backend="xla")
    )(2.0)
    assert float(value) == pytest.approx(2.0)  # (2 - 1)^2 * 2
    # a traced weight is taken as given, with no check: a negative schedule value is the caller's
    negative = jax.jit(lambda w: penalty.penalty_from_grads(jnp.ones((1, 4)), weight=w))(-2.0)
    assert float(negative) == pytest.approx(-2.0)


WEIGHTED = {
    "gradient_penalty": lambda **kw: penalty.gradient_penalty(critic, jnp.ones((1, 4)), **kw),
    "gradient_penalty_and_norms": lambda **kw: penalty.gradient_penalty_and_norms(
        critic, jnp.ones((1, 4)), **kw
    )[0],
    "penalty_from_grads": lambda **kw: penalty.penalty_from_grads(jnp.ones((1, 4)), **kw),
    "penalty_and_norms_from_grads": lambda **kw: penalty.penalty_and_norms_from_grads(
        jnp.ones((1, 4)), **kw
    )[0],
}


@pytest.mark.parametrize("name", list(WEIGHTED))
@pytest.mark.parametrize("weight", [-1.0, -1e-8, jnp.float32(-3.0)])
def test_a_negative_weight_is_refused_and_zero_is_allowed(name, weight):
    with pytest.raises(ValueError, match=r"weight must be >= 0.*rewards steep gradients"):
        WEIGHTED[name](weight=weight)
    assert float(WEIGHTED[name](weight=0.0)) == 0.0
    assert float(WEIGHTED[name](weight=2.0)) == pytest.approx(2.0)  # (2 - 1)^2 * 2


AXIS_NAMED = {
    "gradient_penalty": lambda **kw: penalty.gradient_penalty(critic, jnp.ones((4, 3)), **kw),
    "gradient_penalty/reverse": lambda **kw: penalty.gradient_penalty(
        critic, jnp.ones((4, 3)), second_order="reverse", **kw
    ),
    "penalty_from_grads": lambda **kw: penalty.penalty_from_grads(jnp.ones((4, 3)), **kw),
    "grad_norms": lambda **kw: penalty.grad_norms(jnp.ones((4, 3)), **kw),
    "interpolate": lambda **kw: penalty.interpolate(KEY, jnp.ones((4, 3)), jnp.ones((4, 3)), **kw),
    "approximate_r1": lambda **kw: fastgp.approximate_r1(
        critic, jnp.ones((4, 3)), KEY, sigma=0.1, weight=1.0, **kw
    ),
}
ROLES = {
    "axis_name": "splits the batch (the mean is then over the global batch)",
    "sample_axis_name": "splits each sample",
}


@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize(
    "name,what",
    [
        (name, what)
        for name in AXIS_NAMED
        for what in ROLES
        if (name, what) != ("grad_norms", "axis_name")
    ],
)
def test_an_axis_name_outside_shard_map_is_a_fastgp_error_naming_it(name, what, jit):
    """Outside shard_map (eagerly, or under jax.jit with no mesh axis bound) a named axis was
    JAX's ``NameError: unbound axis name``; it is a ValueError that names the axis, says what the
    argument is for and where it applies, and that plain jax.jit needs none (grad_norms takes
    only sample_axis_name)."""
    call = functools.partial(AXIS_NAMED[name], **{what: "data"})
    with pytest.raises(ValueError) as err:
        jax.jit(call)() if jit else call()
    message = str(err.value)
    assert f"{what}='data' names the mesh axis 'data'" in message
    assert ROLES[what] in message
    assert "inside jax.shard_map(..., mesh=mesh) with 'data' in mesh.axis_names" in message
    assert "Under plain jax.jit with sharded arrays" in message
    assert f"leave {what}=None" in message


def test_only_the_unbound_axes_of_a_tuple_are_named():
    mesh = jax.make_mesh((2,), ("data",), axis_types=(AxisType.Auto,))
    step = jax.shard_map(
        lambda x: penalty.gradient_penalty(critic, x, axis_name=("data", "model")),
        mesh=mesh,
        in_specs=P("data"),
        out_specs=P(),
    )
    with pytest.raises(ValueError, match=r"names the mesh axis 'model', which no enclosing"):
        jax.jit(step)(jnp.ones((4, 3)))
    # the same spelling with every axis bound is the global-batch mean, as on one device
    bound = jax.shard_map(
        lambda x: penalty.gradient_penalty(critic, x, axis_name="data"),
        mesh=mesh,
        in_specs=P("data"),
        out_specs=P(),
    )
    x = jax.random.normal(KEY, (4, 3))
    assert float(jax.jit(bound)(x)) == pytest.approx(float(penalty.gradient_penalty(critic, x)))


def test_pallas_backend_on_a_cpu_lowering_says_what_to_use_instead():
    with pytest.raises(
        ValueError, match=r"backend=.pallas.*lowered for another platform.*.interpret."
    ):
        jax.jit(lambda x: penalty.gradient_penalty(critic, x, backend="pallas"))(jnp.ones((2, 3)))


def test_a_per_sample_critic_gets_a_note_naming_vmap():
    """An Equinox-style critic written for one sample fails inside itself; fastgp says why."""
    w = jnp.ones((5, 3))
    per_sample = lambda s: jnp.sum(jnp.tanh(w @ s))  # (3,) -> ()
    for second_order in ("reverse-over-forward", "reverse"):
        with pytest.raises(TypeError) as err:
            penalty.gradient_penalty(per_sample, jnp.ones((4, 3)), second_order=second_order)
        assert any("jax.vmap(model)" in note for note in getattr(err.value, "__notes__", []))
    assert penalty.gradient_penalty(jax.vmap(per_sample), jnp.ones((4, 3))).shape == ()


def test_an_unhashable_critic_is_fine():
    """Critics need not be hashable (Equinox modules and dataclasses holding arrays are not)."""
    import dataclasses

    @dataclasses.dataclass
    class Critic:
        w: jax.Array

        def __call__(self, x):
            return jnp.tanh(x @ self.w)

    x = jax.random.normal(KEY, (4, 3))
    w = jnp.array([0.5, -1.0, 2.0])
    ours = jax.grad(lambda w: penalty.gradient_penalty(Critic(w), x))(w)
    naive = jax.grad(lambda w: reference.naive_gradient_penalty(Critic(w), x))(w)
    assert float(jnp.max(jnp.abs(naive))) > 0
    assert jnp.allclose(ours, naive, rtol=1e-5, atol=1e-7)
