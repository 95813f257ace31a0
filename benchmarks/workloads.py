"""Benchmark workloads shared by the pytest-benchmark suites and the TPU compile script.

    CRITICS[name], TPU_CRITICS[name] -> CriticSpec (model, batch, per-sample shape, dtype, kind)
    critic_step(spec, variant)       -> step(params, opt_state, real, fake, key)
                                        -> (params, opt, loss)
    lazy_steps(spec, every, n)       -> n critic steps from Python, a penalty each ``every`` steps
    run_steps(steps, schedule)       -> jitted steps dispatched from Python, chaining the state
    penalty_vjp(path)                -> f(g) = value_and_grad of the penalty on gradients wrt g
    inputs(spec)                     -> (params, opt_state, real, fake, key) concrete arrays

Variants of the penalty inside a critic step (``fastgp.penalty.gradient_penalty`` unless naive):

    plain           critic loss only (the floor: what a step costs with no penalty)
    naive           fastgp.naive_gradient_penalty (nested jax.grad, plain jnp)
    fastgp          the default: backend="auto", second_order="reverse-over-forward"
    fastgp-xla      backend="xla" (the plain jnp reduction, also on TPU)
    fastgp-pallas   backend="pallas" (the kernels on every leaf)
    fastgp-reverse  second_order="reverse" (nested reverse mode)
    fastgp-remat    remat="nothing"
    fastgp-dots     remat="dots"
    naive-remat     the naive penalty with the critic under jax.checkpoint(nothing_saveable)
    exact-r1        fastgp's default R1 at the reals, whatever the spec's kind
    approximate-r1  fastgp.approximate_r1 at the reals, sigma APPROXIMATE_SIGMA, the weight that
                    matches exact-r1's (weight / sigma**2)
"""

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.sharding import PartitionSpec as P
from jax.typing import DTypeLike

from fastgp import approximate_r1, naive_gradient_penalty, naive_penalty_from_grads, penalty
from fastgp.train.models.networks import Model, mlp

GP_WEIGHT = 10.0
VARIANTS = (
    "plain",
    "naive",
    "fastgp",
    "fastgp-xla",
    "fastgp-pallas",
    "fastgp-reverse",
    "fastgp-remat",
    "fastgp-dots",
    "naive-remat",
    "exact-r1",
    "approximate-r1",
)
APPROXIMATE_SIGMA = 0.01
OPTIONS: dict[str, dict[str, Any]] = {
    "fastgp": {},
    "fastgp-xla": dict(backend="xla"),
    "fastgp-pallas": dict(backend="pallas"),
    "fastgp-reverse": dict(second_order="reverse"),
    "fastgp-remat": dict(remat="nothing"),
    "fastgp-dots": dict(remat="dots"),
}


def dcgan_critic(
    channels: int = 32,
    image: int = 32,
    in_channels: int = 3,
    layout: str = "NCHW",
    layers: int | None = None,
) -> Model:
    """DCGAN critic without batch norm: 4x4 stride-2 convs (c, 2c, 4c, ...), LeakyReLU 0.2,
    dense -> (B,). By default enough convs to reach 4x4 (32 -> 16 -> 8 -> 4; 64 adds an 8c conv).
    ``layout`` "NCHW" (OIHW kernels) or "NHWC" (HWIO kernels)."""
    nchw = layout == "NCHW"
    dn = ("NCHW", "OIHW", "NCHW") if nchw else ("NHWC", "HWIO", "NHWC")
    layers = layers or int(math.log2(image // 4))
    side = image >> layers
    widths = [in_channels] + [channels * 2**i for i in range(layers)]

    def init(key):
        keys = jax.random.split(key, layers + 1)
        params = []
        for k, c_in, c_out in zip(keys, widths[:-1], widths[1:], strict=False):
            std = math.sqrt(2.0 / (c_in * 16))
            shape = (c_out, c_in, 4, 4) if nchw else (4, 4, c_in, c_out)
            params.append(
                {
                    "w": std * jax.random.normal(k, shape, jnp.float32),
                    "b": jnp.zeros((c_out,), jnp.float32),
                }
            )
        fan_in = widths[-1] * side * side
        params.append(
            {
                "w": jax.random.normal(keys[-1], (fan_in, 1)) / math.sqrt(fan_in),
                "b": jnp.zeros((1,), jnp.float32),
            }
        )
        return params

    def apply(params, x, dtype=jnp.float32):
        p = jax.tree.map(lambda a: a.astype(dtype), params)
        h = x.astype(dtype)
        for layer in p[:-1]:
            h = lax.conv_general_dilated(
                h, layer["w"], (2, 2), ((1, 1), (1, 1)), dimension_numbers=dn
            )
            bias = layer["b"][None, :, None, None] if nchw else layer["b"]
            h = jax.nn.leaky_relu(h + bias, 0.2)
        h = h.reshape(h.shape[0], -1)
        return (h @ p[-1]["w"] + p[-1]["b"])[:, 0].astype(jnp.float32)

    return Model(init, apply)


def _mean_pool_2x2(h):
    """(B, H, W, C) -> (B, H/2, W/2, C). Under explicit sharding the split of a sharded H or W
    needs its output sharding spelled out, as any explicitly sharded model must."""
    b, height, width, c = h.shape
    sharding = jax.typeof(h).sharding
    out_sharding = None
    if not sharding.mesh.empty:
        sb, sh, sw, sc = tuple(sharding.spec) + (None,) * (4 - len(sharding.spec))
        out_sharding = sharding.update(spec=P(sb, sh, None, sw, None, sc))
    split = lax.reshape(h, (b, height // 2, 2, width // 2, 2, c), out_sharding=out_sharding)
    return split.mean(axis=(2, 4))


def meanpool_critic(
    channels: int = 32, image: int = 32, in_channels: int = 3, blocks: int = 3
) -> Model:
    """NHWC critic of the WGAN-GP paper's family without residuals: per block a 3x3 stride-1 conv
    (c, 2c, 4c, ...), LeakyReLU 0.2 and 2x2 mean-pool downsampling; then a dense head -> (B,),
    written as one contraction over (H, W, C) so that a sharded spatial axis needs no reshape."""
    widths = [in_channels] + [channels * 2**i for i in range(blocks)]
    side = image >> blocks

    def init(key):
        keys = jax.random.split(key, blocks + 1)
        params = [
            {
                "w": math.sqrt(2.0 / (9 * c_in)) * jax.random.normal(k, (3, 3, c_in, c_out)),
                "b": jnp.zeros((c_out,), jnp.float32),
            }
            for k, c_in, c_out in zip(keys, widths[:-1], widths[1:], strict=False)
        ]
        head = (side, side, widths[-1])
        params.append(
            {
                "w": jax.random.normal(keys[-1], head) / math.sqrt(math.prod(head)),
                "b": jnp.zeros((), jnp.float32),
            }
        )
        return params

    def apply(params, x, dtype=jnp.float32):
        p = jax.tree.map(lambda a: a.astype(dtype), params)
        h = x.astype(dtype)
        for layer in p[:-1]:
            h = lax.conv_general_dilated(
                h, layer["w"], (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
            )
            h = _mean_pool_2x2(jax.nn.leaky_relu(h + layer["b"], 0.2))
        return (jnp.einsum("bijk,ijk->b", h, p[-1]["w"]) + p[-1]["b"]).astype(jnp.float32)

    return Model(init, apply)


class CriticSpec(NamedTuple):
    name: str
    model: Model
    batch: int
    shape: tuple  # per-sample input shape
    dtype: DTypeLike = jnp.float32  # inputs and computation; parameters stay float32
    kind: str = "wgan-gp"  # the penalty: "wgan-gp"/"wgan-lp" at interpolates, "r1" at the reals


CRITICS = {
    "mlp2": CriticSpec("mlp2", mlp([2, 512, 512, 512, 1]), 256, (2,)),
    "mlp3072": CriticSpec("mlp3072", mlp([3072, 512, 512, 512, 1]), 256, (3072,)),
    "dcgan32": CriticSpec("dcgan32", dcgan_critic(32, 32), 32, (3, 32, 32)),
    "dcgan32-nhwc": CriticSpec(
        "dcgan32-nhwc", dcgan_critic(32, 32, layout="NHWC"), 32, (32, 32, 3)
    ),
}
TPU_CRITICS = {
    "mlp3072": CRITICS["mlp3072"],
    "dcgan32": CRITICS["dcgan32"],
    "dcgan64-bf16": CriticSpec(
        "dcgan64-bf16", dcgan_critic(16, 64, layers=3), 32, (3, 64, 64), jnp.bfloat16
    ),
}


def optimizer():
    return optax.adam(1e-4, b1=0.0, b2=0.9)


def _penalty(variant, critic, x_hat, weight, axis_name=None, kind="wgan-gp"):
    if variant in ("naive", "naive-remat"):
        if variant == "naive-remat":
            critic = penalty.remat_critic(critic, "nothing")
        value = naive_gradient_penalty(critic, x_hat, kind=kind, weight=weight)
        # equal shards: the mean of per-shard means is the global mean
        return value if axis_name is None else lax.pmean(value, axis_name)
    return penalty.gradient_penalty(
        critic, x_hat, kind=kind, weight=weight, axis_name=axis_name, **OPTIONS[variant]
    )


def critic_loss(
    spec, variant, params, real, fake, key, weight=GP_WEIGHT, apply_gp=True, axis_name=None
):
    """mean D(fake) - mean D(real), plus the penalty unless the variant is plain: ``spec.kind``
    at interpolates of real and fake, or for ``kind == "r1"`` at the reals (no interpolation)."""
    critic = functools.partial(spec.model.apply, params, dtype=spec.dtype)

    def mean(v):
        total = jnp.sum(v)
        count = jnp.float32(v.shape[0])
        if axis_name is not None:
            total, count = lax.psum(total, axis_name), lax.psum(count, axis_name)
        return total / count

    loss = mean(critic(fake)) - mean(critic(real))
    if variant == "plain" or not apply_gp:
        return loss
    if variant == "exact-r1":
        return loss + penalty.gradient_penalty(
            critic, real, kind="r1", weight=weight, axis_name=axis_name
        )
    if variant == "approximate-r1":
        sigma = APPROXIMATE_SIGMA
        return loss + approximate_r1(
            critic, real, key, sigma=sigma, weight=weight / sigma**2, axis_name=axis_name
        )
    r1 = spec.kind == "r1"
    x_hat = real if r1 else penalty.interpolate(key, real, fake, axis_name=axis_name)
    return loss + _penalty(variant, critic, x_hat, weight, axis_name, spec.kind)


def critic_step(spec, variant, *, axis_name=None):
    """One critic update (value_and_grad wrt params + Adam), unjitted."""
    opt = optimizer()

    def step(params, opt_state, real, fake, key):
        loss, grads = jax.value_and_grad(
            lambda p: critic_loss(spec, variant, p, real, fake, key, axis_name=axis_name)
        )(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


def run_steps(steps, schedule):
    """Critic steps dispatched from Python: ``schedule[i]`` picks the jitted step (an index into
    ``steps``) for step i; parameters and optimiser state chain from step to step.

    Lazy regularisation selects the penalised or the plain step in Python rather than with
    ``lax.cond`` or inside ``lax.scan``: XLA:CPU runs a convolution inside a conditional branch
    or a while loop about 9x slower than the same convolution at top level (measured here,
    32x32x16x16 input, 4x4 stride-2 conv to 64 channels: 1.7 ms top level, 15 ms in a cond
    branch, 15 ms per iteration in a fori_loop), which would swamp the comparison for the conv
    critic. On TPU either form is fine."""

    def run(params, opt_state, real, fake, key):
        loss = None
        for index in schedule:
            params, opt_state, loss = steps[index](params, opt_state, real, fake, key)
        return params, opt_state, loss

    return run


def lazy_steps(spec, every, n):
    """``n`` critic steps with the penalty (weight x ``every``) on steps ``i % every == 0``."""
    opt = optimizer()

    def step(apply_gp):
        def one(params, opt_state, real, fake, key):
            loss, g = jax.value_and_grad(
                lambda p: critic_loss(
                    spec, "fastgp", p, real, fake, key, weight=GP_WEIGHT * every, apply_gp=apply_gp
                )
            )(params)
            updates, opt_state = opt.update(g, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss

        return jax.jit(one)

    return run_steps([step(False), step(True)], [int(i % every == 0) for i in range(n)])


def inputs(spec, seed=0):
    k1, k2, k3, k4 = jax.random.split(jax.random.PRNGKey(seed), 4)
    params = spec.model.init(k1)
    shape = (spec.batch,) + tuple(spec.shape)
    real = jax.random.normal(k2, shape, jnp.float32).astype(spec.dtype)
    fake = jax.random.normal(k3, shape, jnp.float32).astype(spec.dtype)
    return params, optimizer().init(params), real, fake, k4


def penalty_vjp(path):
    """value_and_grad wrt g of the penalty on precomputed gradients, for ``path`` in
    ("naive", "xla", "interpret")."""
    if path == "naive":
        f = lambda g: naive_penalty_from_grads(g, weight=GP_WEIGHT)
    else:
        f = lambda g: penalty.penalty_from_grads(g, weight=GP_WEIGHT, backend=path)
    return jax.value_and_grad(f)
