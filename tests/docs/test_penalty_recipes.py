"""docs/recipes.md's CTGAN packed penalty and R3GAN's R1 + R2, run as written, against oracles.

The recipes' code is read from the page (the sections' Python blocks, run in one namespace), so
what is tested is what users copy. The oracles are written from the papers' code independently of
fastgp: CTGAN's ``calc_gradient_penalty`` (alpha repeated over each pack's rows, input gradients
of the unpacked rows, the norm over ``view(-1, pac * dim)``) and R3GAN's
``(gamma / 2) * (R1 + R2)`` with nested ``jax.grad``, plus ``fastgp.naive_gradient_penalty``.
"""

import pathlib
import re
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import fastgp

RECIPES = pathlib.Path(__file__).resolve().parents[2] / "docs" / "recipes.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
PRELUDE = """
import jax, jax.numpy as jnp, numpy as np
real = jnp.asarray(np.random.default_rng(1).standard_normal((16, 2)), jnp.float32)
key = jax.random.key(3)
"""
RTOL = 1e-5


def recipe(heading):
    """The namespace after running the Python blocks of the section titled ``heading``."""
    text = RECIPES.read_text()
    start = text.index(f"\n## {heading}")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end != -1 else len(text)]
    namespace = {"__name__": "recipe"}
    exec(PRELUDE, namespace)
    codes = [textwrap.dedent(b) for b in BLOCK.findall(section)]
    assert codes, f"no Python block under {heading!r}"
    for i, code in enumerate(codes):
        exec(compile(code, f"recipes.md {heading!r} block {i + 1}", "exec"), namespace)
    return namespace


def ravel(tree):
    return np.concatenate([np.asarray(x, np.float64).ravel() for x in jax.tree.leaves(tree)])


def assert_close(ours, ref, rtol=RTOL):
    """Relative to the reference's largest entry; a zero reference compares nothing, so fails."""
    ours, ref = ravel(ours), ravel(ref)
    assert ours.shape == ref.shape
    scale = np.max(np.abs(ref))
    assert scale > 0, "the reference is identically zero"
    np.testing.assert_allclose(ours, ref, rtol=0, atol=rtol * scale)


# --- CTGAN --------------------------------------------------------------------------------------

CTGAN = "CTGAN's packed penalty"


@pytest.fixture(scope="module")
def ctgan():
    return recipe(CTGAN)


def ctgan_loss(apply_critic, params, real, fake, alpha_packs, pac, lambda_=10.0):
    """CTGAN's critic loss, written from its PyTorch code on unpacked (B, dim) rows.

    alpha of shape (B / pac, 1, 1) repeated to (B / pac, pac, dim) and viewed as (B, dim); the
    discriminator views its input as (-1, pac * dim); the norm is over gradients.view(-1, pac*dim).
    """
    batch, dim = real.shape
    discriminator = lambda rows: apply_critic(params, rows.reshape(-1, pac * dim))
    alpha = jnp.tile(alpha_packs.reshape(-1, 1, 1), (1, pac, dim)).reshape(batch, dim)
    interpolates = alpha * real + (1 - alpha) * fake
    gradients = jax.grad(lambda rows: jnp.sum(discriminator(rows)))(interpolates)
    norms = jnp.sqrt(jnp.sum(gradients.reshape(-1, pac * dim) ** 2, axis=1))
    gp = ((norms - 1) ** 2).mean() * lambda_
    loss = -(jnp.mean(discriminator(real)) - jnp.mean(discriminator(fake))) + gp
    return loss, gp


def alphas_of(key, packs):
    """The per-pack alpha that fastgp.interpolate draws for ``key``: interpolate(0, 1) = alpha.
    fastgp mixes real + alpha (fake - real), CTGAN alpha real + (1 - alpha) fake, so CTGAN's
    alpha is 1 - this."""
    zeros = jnp.zeros((packs, 1))
    return 1 - fastgp.interpolate(key, zeros, jnp.ones((packs, 1)))[:, 0]


def ctgan_problem(ns, pac, rows, seed=0):
    k1, k2, k3, k4, k5 = jax.random.split(jax.random.key(seed), 5)
    params = ns["init_critic"](k1, pac=pac)
    # a non-zero bias so that leaky_relu's kinks are not hit at the origin
    params = {**params, "b1": 0.1 * jax.random.normal(k5, params["b1"].shape)}
    real = jax.random.normal(k2, (rows, ns["DIM"]))
    fake = jax.random.normal(k3, (rows, ns["DIM"]))
    tangent = jax.tree.map(lambda a: jnp.ones_like(a) / np.sqrt(a.size), params)
    return params, real, fake, k4, tangent


def value_grad_hvp(loss, params, tangent):
    """(loss, aux), gradient, Hessian-vector product of a (loss, aux) function of params."""
    (value, aux), grads = jax.value_and_grad(loss, has_aux=True)(params)
    hvp = jax.jvp(lambda p: jax.grad(lambda q: loss(q)[0])(p), (params,), (tangent,))[1]
    return value, aux, grads, hvp


def ctgan_reference(ns, params, real, fake, key, pac, tangent):
    alpha = alphas_of(key, real.shape[0] // pac)
    loss = lambda p: ctgan_loss(ns["apply_critic"], p, real, fake, alpha, pac)
    return value_grad_hvp(loss, params, tangent)


def assert_all_close(ours, ref):
    for a, b, name in zip(ours, ref, ("loss", "gp", "grads", "hvp"), strict=True):
        try:
            assert_close(a, b)
        except AssertionError as err:
            err.add_note(f"comparing {name}")
            raise


@pytest.mark.parametrize("pac", [1, 10])
def test_packed_recipe_equals_ctgan_penalty(ctgan, pac):
    params, real, fake, key, tangent = ctgan_problem(ctgan, pac, rows=4 * pac)
    loss = lambda p: ctgan["critic_loss"](p, real, fake, key, pac=pac)
    assert_all_close(
        value_grad_hvp(loss, params, tangent),
        ctgan_reference(ctgan, params, real, fake, key, pac, tangent),
    )


def test_a_per_row_norm_is_not_ctgans_penalty(ctgan):
    """The comparison above can fail: the same alphas with one norm per row differ."""
    pac = 10
    params, real, fake, key, _ = ctgan_problem(ctgan, pac, rows=4 * pac)
    alpha = alphas_of(key, 4)
    _, gp = ctgan_loss(ctgan["apply_critic"], params, real, fake, alpha, pac)
    rows_alpha = jnp.repeat(1 - alpha, pac)[:, None]
    x_hat = real + rows_alpha * (fake - real)
    per_row = lambda rows: jnp.repeat(
        ctgan["apply_critic"](params, rows.reshape(-1, pac * real.shape[1])), pac
    )
    wrong = fastgp.gradient_penalty(per_row, x_hat, weight=10.0)
    assert abs(float(wrong) - float(gp)) > 1e-2 * abs(float(gp))


@pytest.mark.parametrize("pac", [1, 10])
def test_packed_recipe_inside_shard_map_equals_ctgan_penalty(ctgan, pac):
    devices = 4
    params, real, fake, key, tangent = ctgan_problem(ctgan, pac, rows=2 * pac * devices)
    mesh = jax.make_mesh((devices,), ("data",), devices=jax.devices()[:devices])

    def step(params, real, fake, key):  # each shard: 2 whole packs
        loss = lambda p: ctgan["critic_loss"](p, real, fake, key, pac=pac, axis_name="data")
        return value_grad_hvp(loss, params, tangent)

    fn = jax.shard_map(
        step, mesh=mesh, in_specs=(P(), P("data"), P("data"), P()), out_specs=P(), check_vma=True
    )
    rows = NamedSharding(mesh, P("data"))
    ours = jax.jit(fn)(params, jax.device_put(real, rows), jax.device_put(fake, rows), key)
    assert_all_close(ours, ctgan_reference(ctgan, params, real, fake, key, pac, tangent))


@pytest.mark.parametrize("pac", [1, 10])
def test_packed_recipe_under_jit_with_named_sharding_equals_ctgan_penalty(ctgan, pac):
    devices = 4
    params, real, fake, key, tangent = ctgan_problem(ctgan, pac, rows=2 * pac * devices)
    mesh = jax.make_mesh(
        (devices,), ("data",), devices=jax.devices()[:devices], axis_types=(AxisType.Auto,)
    )
    rows, replicated = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())

    def step(params, real, fake, key):
        loss = lambda p: ctgan["critic_loss"](p, real, fake, key, pac=pac)
        return value_grad_hvp(loss, params, tangent)

    ours = jax.jit(step, in_shardings=(replicated, rows, rows, None))(params, real, fake, key)
    assert_all_close(ours, ctgan_reference(ctgan, params, real, fake, key, pac, tangent))


def test_docs_shard_map_block_equals_the_single_device_block(ctgan):
    """The page's own sharded step (every device) equals its single-device values."""
    for ours, ref in (
        ("sharded_loss", "ctgan_loss"),
        ("sharded_gp", "ctgan_gp"),
        ("sharded_grads", "ctgan_grads"),
    ):
        assert_close(ctgan[ours], ctgan[ref])


# --- R3GAN --------------------------------------------------------------------------------------

R3GAN = "R3GAN: R1 at the reals plus R2 at the fakes"


@pytest.fixture(scope="module")
def r3gan():
    return recipe(R3GAN)


def r3gan_problem(ns, seed=5):
    k1, k2, k3, k4 = jax.random.split(jax.random.key(seed), 4)
    p = {
        "w1": jax.random.normal(k1, (2, 64)) / 2,
        "b1": 0.3 * jax.random.normal(k4, (64,)),
        "w2": jax.random.normal(k2, (64,)) / 8,
    }
    real = jax.random.normal(k3, (16, 2))
    fake = ns["apply_g"](ns["g_params"], jax.random.normal(k4, (16, ns["NOISE"])))
    tangent = jax.tree.map(lambda a: jnp.ones_like(a) / np.sqrt(a.size), p)
    return p, real, fake, tangent


def r3gan_hand_written(apply_d, p, real, fake, gamma):
    """R3GAN's discriminator loss: softplus(D(fake) - D(real)) + (gamma/2)(R1_b + R2_b), mean."""
    critic = lambda x: apply_d(p, x)
    r1 = jnp.sum(jax.grad(lambda x: jnp.sum(critic(x)))(real) ** 2, axis=1)
    r2 = jnp.sum(jax.grad(lambda x: jnp.sum(critic(x)))(fake) ** 2, axis=1)
    adversarial = jax.nn.softplus(critic(fake) - critic(real))
    return jnp.mean(adversarial + gamma / 2 * (r1 + r2)), (
        gamma / 2 * r1.mean(),
        gamma / 2 * r2.mean(),
    )


def r3gan_naive(apply_d, p, real, fake, gamma):
    critic = lambda x: apply_d(p, x)
    adversarial = jax.nn.softplus(critic(fake) - critic(real)).mean()
    r1 = fastgp.naive_gradient_penalty(critic, real, kind="r1", weight=gamma / 2)
    r2 = fastgp.naive_gradient_penalty(critic, fake, kind="r1", weight=gamma / 2)
    return adversarial + r1 + r2, (r1, r2)


@pytest.mark.parametrize("oracle", [r3gan_hand_written, r3gan_naive])
def test_r1_plus_r2_recipe_equals_the_naive_penalties(r3gan, oracle):
    p, real, fake, tangent = r3gan_problem(r3gan)
    gamma = r3gan["gamma_at"](1)
    ours = value_grad_hvp(lambda q: r3gan["d_loss"](q, real, fake, gamma), p, tangent)
    ref = value_grad_hvp(lambda q: oracle(r3gan["apply_d"], q, real, fake, gamma), p, tangent)
    for a, b, name in zip(ours, ref, ("loss", "(r1, r2)", "grads", "hvp"), strict=True):
        try:
            assert_close(a, b)
        except AssertionError as err:
            err.add_note(f"comparing {name}")
            raise


def test_the_penalty_gradient_is_second_order_and_a_detached_one_is_zero(r3gan):
    p, real, _, _ = r3gan_problem(r3gan)
    critic_of = lambda q: lambda x: r3gan["apply_d"](q, x)
    penalty = lambda q: fastgp.gradient_penalty(critic_of(q), real, kind="r1", weight=1.0)
    detached = lambda q: jax.lax.stop_gradient(penalty(q))
    grads = jax.grad(penalty)(p)
    assert np.max(np.abs(ravel(grads))) > 1e-3
    assert np.all(ravel(jax.grad(detached)(p)) == 0)
    # it is the mixed second derivative: 2 (d^2 D / d theta dx)^T grad_x D, by nested jax.grad
    g_x = jax.grad(lambda x: jnp.sum(critic_of(p)(x)))(real)
    mixed = jax.grad(lambda q: jnp.sum(jax.grad(lambda x: jnp.sum(critic_of(q)(x)))(real) * g_x))(p)
    assert_close(grads, jax.tree.map(lambda m: 2 * m / real.shape[0], mixed))


def test_gamma_schedule_falls_tenfold_with_one_compilation(r3gan):
    gamma_at, total, gamma = r3gan["gamma_at"], r3gan["TOTAL_STEPS"], r3gan["GAMMA"]
    values = np.array([float(gamma_at(s)) for s in range(total + 3)])
    np.testing.assert_allclose(values[0], gamma, rtol=1e-6)
    np.testing.assert_allclose(values[total:], gamma / 10, rtol=1e-6)
    assert np.all(np.diff(values[: total + 1]) < 0)
    # the page's loop ran TOTAL_STEPS steps of train_step, traced once (step is an argument)
    assert r3gan["train_step"]._cache_size() == 1
    assert np.isfinite(float(r3gan["r1"])) and float(r3gan["r2"]) > 0
