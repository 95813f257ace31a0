"""Samples that span devices: a sample's tokens or rows split over a mesh axis, inside shard_map
(``sample_axis_name``), under Auto ``jax.jit`` and under explicit axes, against the one-device
naive penalty (value, parameter gradients, a Hessian-vector product; rel 1e-5 of the largest
entry)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import fastgp
from fastgp import penalty
from fastgp._approximate.api import perturb
from oracles import value_grad_hvp

B, T, C, HIDDEN = 8, 16, 3, 12
RTOL = 1e-5


def init():
    k1, k2, k3, k4, k5 = jax.random.split(jax.random.PRNGKey(7), 5)
    params = {
        "embed": jax.random.normal(k1, (C, HIDDEN)) * 0.6,
        "pos": jax.random.normal(k2, (T, HIDDEN)) * 0.3,
        "mix": jax.random.normal(k3, (HIDDEN, HIDDEN)) * 0.4,
        "head": jax.random.normal(k4, (HIDDEN,)),
    }
    real = jax.random.normal(k5, (B, T, C))
    fake = jax.random.normal(jax.random.fold_in(k5, 1), (B, T, C)) * 0.5 + 0.3
    return params, real, fake


def critic(params, x, seq_axis=None):
    """A token critic: per-token features (with a position embedding), a mean over every token of
    the sample (completed over ``seq_axis`` when the tokens are split), a nonlinear head."""
    t_local = x.shape[1]
    start = 0 if seq_axis is None else lax.axis_index(seq_axis) * t_local
    pos = lax.dynamic_slice_in_dim(params["pos"], start, t_local, axis=0)
    h = jnp.tanh(x @ params["embed"] + pos)
    pooled = jnp.sum(h, axis=1)
    if seq_axis is not None:
        pooled = lax.psum(pooled, seq_axis)
    pooled = pooled / T
    return jnp.tanh(pooled @ params["mix"]) @ params["head"]


def one_device(kind):
    """(value, gradient, Hessian-vector product) of the naive penalty on one device."""
    params, real, fake = init()
    x = penalty.interpolate(jax.random.PRNGKey(1), real, fake)

    def loss(p):
        return fastgp.naive_gradient_penalty(lambda y: critic(p, y), x, kind=kind)

    return _value_grad_hvp(loss, params)


def _value_grad_hvp(loss, params):
    direction = jax.tree.map(lambda a: jnp.cos(jnp.arange(a.size).reshape(a.shape)), params)
    return value_grad_hvp(loss, params, direction)


def manual_mesh(shape, names):
    """A mesh for shard_map (Auto axes: shard_map makes them Manual inside)."""
    return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape))


def placed(mesh, spec, *arrays):
    return [jax.device_put(a, NamedSharding(mesh, spec)) for a in arrays]


def assert_close(got, want):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        scale = max(float(np.max(np.abs(w))), 1e-30)
        assert np.max(np.abs(g - w)) <= RTOL * scale, (np.max(np.abs(g - w)), scale)


def shard_mapped(mesh, kind, second_order, batch_axes, seq_axis):
    """The penalty step inside shard_map: x split over ``batch_axes`` (batch) and ``seq_axis``
    (tokens); returns (value, gradient, Hessian-vector product), replicated."""
    params, real, fake = init()
    batch_spec = batch_axes if batch_axes else None

    def step(params, real, fake):
        x = penalty.interpolate(
            jax.random.PRNGKey(1),
            real,
            fake,
            axis_name=batch_axes if batch_axes else None,
            sample_axis_name=seq_axis,
        )

        def loss(p):
            return penalty.gradient_penalty(
                lambda y: critic(p, y, seq_axis),
                x,
                kind=kind,
                axis_name=batch_axes if batch_axes else None,
                sample_axis_name=seq_axis,
                second_order=second_order,
            )

        return _value_grad_hvp(loss, params)

    spec = P(batch_spec, seq_axis)
    fn = jax.shard_map(step, mesh=mesh, in_specs=(P(), spec, spec), out_specs=P(), check_vma=True)
    return jax.jit(fn)(*placed(mesh, P(), params), *placed(mesh, spec, real, fake))


LAYOUTS = {
    "sequence": ((4,), ("seq",), (), "seq"),
    "batch x sequence": ((2, 4), ("data", "seq"), ("data",), "seq"),
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("second_order", ["reverse-over-forward", "reverse"])
@pytest.mark.parametrize("kind", ["wgan-gp", "wgan-lp", "r1"])
def test_shard_map_with_sample_axes_equals_one_device(kind, second_order, layout):
    shape, names, batch_axes, seq_axis = LAYOUTS[layout]
    mesh = manual_mesh(shape, names)
    got = shard_mapped(mesh, kind, second_order, batch_axes, seq_axis)
    assert_close(got, one_device(kind))


def image_critic(params, x, row_axis=None):
    """An image critic over rows: a per-pixel layer, pooled over every row of the image."""
    h = jnp.tanh(jnp.einsum("bhwc,cd->bhwd", x, params["w"]))
    pooled = jnp.sum(h, axis=(1, 2))
    if row_axis is not None:
        pooled = lax.psum(pooled, row_axis)
    return jnp.tanh(pooled / 64.0) @ params["v"]


def test_row_sharded_images_equal_the_one_device_wgan_gp_penalty():
    """The formerly silent case: images row-sharded over "seq", WGAN-GP (whose norm does not add
    over slices), spelled as the docs give it."""
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(3), 3)
    params = {"w": jax.random.normal(k1, (3, 6)), "v": jax.random.normal(k2, (6,))}
    x = jax.random.normal(k3, (4, 8, 8, 3))
    mesh = manual_mesh((2, 4), ("data", "seq"))
    step = jax.shard_map(
        lambda p, x: penalty.gradient_penalty(
            lambda y: image_critic(p, y, "seq"), x, axis_name="data", sample_axis_name="seq"
        ),
        mesh=mesh,
        in_specs=(P(), P("data", "seq")),
        out_specs=P(),
    )
    want = fastgp.naive_gradient_penalty(lambda y: image_critic(params, y), x)
    got = jax.jit(step)(*placed(mesh, P(), params), *placed(mesh, P("data", "seq"), x))
    np.testing.assert_allclose(got, want, rtol=RTOL)


def test_naming_a_sample_axis_as_a_batch_axis_is_refused():
    """Naming "seq" in axis_name (the spelling that used to return a quarter of the value) is an
    error: the critic's scores are whole on every slice while x differs."""
    params, real, _ = init()
    mesh = manual_mesh((4,), ("seq",))
    step = jax.shard_map(
        lambda p, x: penalty.gradient_penalty(lambda y: critic(p, y, "seq"), x, axis_name="seq"),
        mesh=mesh,
        in_specs=(P(), P(None, "seq")),
        out_specs=P(),
    )
    with pytest.raises(ValueError, match="sample_axis_name"):
        jax.jit(step)(*placed(mesh, P(), params), *placed(mesh, P(None, "seq"), real))


def test_the_guard_names_both_kinds_and_either_spelling_it_gives_is_right():
    params, real, _ = init()
    mesh = manual_mesh((4,), ("seq",))

    def run(**names):
        step = jax.shard_map(
            lambda p, x: penalty.gradient_penalty(lambda y: critic(p, y, "seq"), x, **names),
            mesh=mesh,
            in_specs=(P(), P(None, "seq")),
            out_specs=P(),
        )
        return jax.jit(step)(*placed(mesh, P(), params), *placed(mesh, P(None, "seq"), real))

    with pytest.raises(ValueError) as err:
        run()
    message = str(err.value)
    assert "axis_name='seq'" in message and "sample_axis_name='seq'" in message
    # Following the sample-axis spelling gives the one-device value; the batch-axis spelling
    # is refused for this critic (above), never a wrong value.
    want = fastgp.naive_gradient_penalty(lambda y: critic(params, y), real)
    np.testing.assert_allclose(run(sample_axis_name="seq"), want, rtol=RTOL)


def test_an_unnamed_axis_is_refused_even_when_another_is_named():
    params, real, _ = init()
    mesh = manual_mesh((2, 4), ("data", "seq"))
    step = jax.shard_map(
        lambda p, x: penalty.gradient_penalty(lambda y: critic(p, y, "seq"), x, axis_name="data"),
        mesh=mesh,
        in_specs=(P(), P("data", "seq")),
        out_specs=P(),
    )
    with pytest.raises(ValueError, match=r"\('seq',\).*neither"):
        jax.jit(step)(*placed(mesh, P(), params), *placed(mesh, P("data", "seq"), real))


def forgetful_step(name, params, key, **names):
    """``name`` on x split over ("data", "seq") inside shard_map, with the axes ``names`` gives."""

    def step(p, x, f):
        if name == "interpolate":
            return penalty.interpolate(key, x, f, **names)
        if name == "approximate_r1":  # with the noisy points it drew (test below)
            value = fastgp.approximate_r1(
                lambda y: critic(p, y, "seq"), x, key, sigma=0.1, weight=1.0, **names
            )
            return value, perturb(key, x, 0.1, names.get("axis_name"), "seq")
        return penalty.gradient_penalty(lambda y: critic(p, y, "seq"), x, **names)

    mesh = manual_mesh((2, 4), ("data", "seq"))
    spec = P("data", "seq")
    out = {"interpolate": spec, "approximate_r1": (P(), spec)}.get(name, P())
    run = jax.shard_map(step, mesh=mesh, in_specs=(P(), spec, spec), out_specs=out)
    _, real, fake = init()
    return jax.jit(run)(*placed(mesh, P(), params), *placed(mesh, spec, real, fake))


@pytest.mark.parametrize("name", ["gradient_penalty", "approximate_r1", "interpolate"])
def test_a_forgotten_batch_axis_is_refused_when_the_sample_axis_is_named(name):
    """The mirror of the case above: the tokens' axis "seq" named, the batch's axis "data"
    forgotten (the mean would be this shard's, and every shard would draw the same alphas or
    noise). The error names "data" and both of its spellings; the batch-axis one gives the
    one-device value, and the sample-axis one, taken as written, is refused, never a wrong
    value."""
    params, real, fake = init()
    key = jax.random.PRNGKey(1)
    with pytest.raises(ValueError) as err:
        forgetful_step(name, params, key, sample_axis_name="seq")
    message = str(err.value)
    assert "mesh axes ('data',)" in message
    assert "neither axis_name=None nor sample_axis_name='seq' names" in message
    assert "axis_name='data' for data parallelism" in message
    assert "sample_axis_name='data' for sequence parallelism" in message
    with pytest.raises(ValueError, match=r"\('seq',\).*neither"):
        forgetful_step(name, params, key, sample_axis_name="data")
    if name != "interpolate":  # the critic's scores vary over "data": not whole-sample scores
        with pytest.raises(ValueError, match=r"scores vary over the sample axes \('data',\)"):
            forgetful_step(name, params, key, sample_axis_name=("seq", "data"))
    got = forgetful_step(name, params, key, axis_name="data", sample_axis_name="seq")
    if name == "interpolate":
        want = penalty.interpolate(key, real, fake)
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=1e-6)
    elif name == "gradient_penalty":
        want = fastgp.naive_gradient_penalty(lambda y: critic(params, y), real)
        np.testing.assert_allclose(got, want, rtol=RTOL)
    else:
        value, noisy = got
        want = jnp.mean((critic(params, noisy) - critic(params, real)) ** 2)
        np.testing.assert_allclose(value, want, rtol=RTOL)


def test_partial_scores_and_an_axis_of_both_kinds_are_refused():
    params, real, _ = init()
    mesh = manual_mesh((4,), ("seq",))

    def run(critic_fn, **names):
        step = jax.shard_map(
            lambda p, x: penalty.gradient_penalty(lambda y: critic_fn(p, y), x, **names),
            mesh=mesh,
            in_specs=(P(), P(None, "seq")),
            out_specs=P(),
        )
        return jax.jit(step)(*placed(mesh, P(), params), *placed(mesh, P(None, "seq"), real))

    with pytest.raises(ValueError, match="scores vary over the sample axes"):
        run(lambda p, y: critic(p, y), sample_axis_name="seq")  # no psum: per-slice scores
    with pytest.raises(ValueError, match="named both"):
        run(lambda p, y: critic(p, y, "seq"), axis_name="seq", sample_axis_name="seq")


def test_norms_penalties_and_interpolation_with_sample_axes():
    """grad_norms and penalty_from_grads sum a sample's squares over its slices; interpolate
    gives every slice of a sample the same alpha, equal to one device's."""
    params, real, fake = init()
    grads = jax.grad(lambda x: jnp.sum(critic(params, x)))(real)
    mesh = manual_mesh((2, 4), ("data", "seq"))

    def step(g, r, f):
        norms = penalty.grad_norms(g, sample_axis_name="seq")
        value = penalty.penalty_from_grads(
            g, kind="wgan-gp", axis_name="data", sample_axis_name="seq"
        )
        x = penalty.interpolate(
            jax.random.PRNGKey(1), r, f, axis_name="data", sample_axis_name="seq"
        )
        return norms, value, x

    got_norms, got_value, got_x = jax.jit(
        jax.shard_map(
            step,
            mesh=mesh,
            in_specs=(P("data", "seq"),) * 3,
            out_specs=(P("data"), P(), P("data", "seq")),
        )
    )(*placed(mesh, P("data", "seq"), grads, real, fake))
    np.testing.assert_allclose(got_norms, jnp.sqrt(jnp.sum(grads**2, axis=(1, 2))), rtol=RTOL)
    np.testing.assert_allclose(
        got_value, fastgp.naive_penalty_from_grads(grads, kind="wgan-gp"), rtol=RTOL
    )
    np.testing.assert_allclose(
        got_x, penalty.interpolate(jax.random.PRNGKey(1), real, fake), rtol=RTOL, atol=1e-6
    )


@pytest.mark.parametrize("mode", ["auto", "explicit"])
@pytest.mark.parametrize("kind", ["wgan-gp", "r1"])
def test_jit_with_tokens_sharded_needs_no_names(kind, mode):
    """Under jax.jit the arrays are global: the norm spans every shard by itself."""
    params, real, fake = init()
    types = (AxisType.Auto if mode == "auto" else AxisType.Explicit,) * 2
    mesh = jax.make_mesh((2, 4), ("data", "seq"), axis_types=types)
    spec = NamedSharding(mesh, P("data", "seq"))
    x = penalty.interpolate(jax.random.PRNGKey(1), real, fake)

    def loss(p, x):
        return penalty.gradient_penalty(lambda y: critic(p, y), x, kind=kind)

    step = jax.jit(functools.partial(_value_grad_hvp_at, loss))
    with jax.set_mesh(mesh):
        got = step(jax.device_put(params, NamedSharding(mesh, P())), jax.device_put(x, spec))
    assert_close(got, one_device(kind))


def _value_grad_hvp_at(loss, params, x):
    return _value_grad_hvp(lambda p: loss(p, x), params)


def test_approximate_r1_squares_each_samples_difference_once_its_score_is_whole():
    """approximate_r1 over row-split samples equals the one-device formula on the noise the
    slices drew: weight * mean_b (D(x_b + sigma eps_b) - D(x_b))^2 with whole-sample scores."""
    params, real, _ = init()
    mesh = manual_mesh((2, 4), ("data", "seq"))
    spec = P("data", "seq")
    key = jax.random.PRNGKey(4)

    def step(p, x):
        value = fastgp.approximate_r1(
            lambda y: critic(p, y, "seq"),
            x,
            key,
            sigma=0.1,
            weight=100.0,
            axis_name="data",
            sample_axis_name="seq",
        )
        noisy = perturb(key, x, 0.1, "data", "seq")
        return value, noisy

    run = jax.shard_map(step, mesh=mesh, in_specs=(P(), spec), out_specs=(P(), spec))
    value, noisy = jax.jit(run)(*placed(mesh, P(), params), *placed(mesh, spec, real))
    want = 100.0 * jnp.mean((critic(params, noisy) - critic(params, real)) ** 2)
    np.testing.assert_allclose(value, want, rtol=RTOL)
    # every slice drew its own noise: no two slices of a sample share it
    eps = np.asarray(noisy - real).reshape(B, 4, T // 4, C)
    assert not np.allclose(eps[:, 0], eps[:, 1])


def test_approximate_r1_refuses_per_slice_scores():
    params, real, _ = init()
    mesh = manual_mesh((4,), ("seq",))
    run = jax.shard_map(
        lambda p, x: fastgp.approximate_r1(
            lambda y: critic(p, y),
            x,
            jax.random.PRNGKey(0),
            sigma=0.1,
            weight=1.0,
            sample_axis_name="seq",
        ),
        mesh=mesh,
        in_specs=(P(), P(None, "seq")),
        out_specs=P(),
    )
    with pytest.raises(ValueError, match="scores vary over the sample axes"):
        jax.jit(run)(*placed(mesh, P(), params), *placed(mesh, P(None, "seq"), real))
