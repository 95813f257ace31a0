"""Multi-device scenarios for tests/train/test_trainer.py, each run in a fresh interpreter.

    python tests/multidevice_worker.py SCENARIO DEVICES     -> one JSON line on stdout

The device count must be fixed before JAX starts, so the test process itself stays on one device
and every multi-device check runs here, in a subprocess.
"""

import functools
import itertools
import json
import re
import sys
from collections.abc import Callable

import jax

jax.config.update("jax_num_cpu_devices", int(sys.argv[2]) if len(sys.argv) > 2 else 1)

# The imports below come after the device count is set, before anything can start JAX (E402).
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from fastgp import distributed  # noqa: E402
from fastgp._penalty import api as penalty_api  # noqa: E402
from fastgp._penalty import second_order  # noqa: E402
from fastgp.penalty import gradient_penalty_and_norms  # noqa: E402
from fastgp.train.config import TrainConfig  # noqa: E402
from fastgp.train.models.networks import Model  # noqa: E402
from fastgp.train.objective import penalties  # noqa: E402
from fastgp.train.run import check  # noqa: E402
from fastgp.train.trainers import trainer  # noqa: E402
from fastgp.train.trainers.naive_trainer import NaiveTrainer  # noqa: E402

SCENARIOS: dict[str, Callable[[int], dict]] = {}


def scenario(fn):
    SCENARIOS[fn.__name__] = fn
    return fn


def tiny_mlp(sizes):
    """tanh MLP (B, sizes[0]) -> (B, sizes[-1]), squeezed to (B,) when the output width is 1."""

    def init(key):
        keys = jax.random.split(key, len(sizes) - 1)
        return [
            {"w": jax.random.normal(k, (i, o)) / np.sqrt(i), "b": jnp.zeros(o)}
            for k, i, o in zip(keys, sizes[:-1], sizes[1:], strict=True)
        ]

    def apply(params, x, dtype=jnp.float32):
        h = x.astype(dtype)
        for n, layer in enumerate(params):
            h = h @ layer["w"].astype(dtype) + layer["b"].astype(dtype)
            if n < len(params) - 1:
                h = jnp.tanh(h)
        return (h[:, 0] if sizes[-1] == 1 else h).astype(jnp.float32)

    return Model(init, apply)


def gaussian(key, n):
    return 1.5 + 0.5 * jax.random.normal(key, (n, 2), jnp.float32)


def problem(sample_real=gaussian):
    return tiny_mlp([2, 16, 2]), tiny_mlp([2, 16, 1]), sample_real


def tolist(tree):
    return jax.tree.map(lambda a: np.asarray(a).tolist(), tree)


@scenario
def shard_stats(devices):
    """Per-core norm statistics of the sharded run and the naive per-sample norms."""
    config = TrainConfig(batch_size=24, n_critic=2, backend="tpu-interpret", lr_d=1e-3, lr_g=1e-3)
    sharded = trainer.Trainer(config, *problem())
    _, metrics = sharded.run(sharded.init(), 2)
    naive = NaiveTrainer(config, *problem())
    _, ref = naive.run(naive.init(), 2)

    def nan_at_13(key, n):  # one NaN sample: global index 13 lies on core 13 // (24 // devices)
        return gaussian(key, n).at[13].set(jnp.nan)

    poisoned = trainer.Trainer(
        TrainConfig(batch_size=24, n_critic=1, backend="xla"), *problem(nan_at_13)
    )
    _, bad = poisoned.run(poisoned.init(), 1)
    names = ("norm_mean", "norm_min", "norm_max", "nonfinite")
    return {
        "sharded": tolist({k: metrics[k] for k in names}),
        "naive_norms": tolist(ref["norms"]),
        "poisoned_nonfinite": tolist(bad["nonfinite"]),
    }


@scenario
def bf16(devices):
    """bfloat16 training: finite, close to float32, and equal to the naive bf16 path."""
    runs = {}
    for precision in ("f32", "bf16"):
        config = TrainConfig(
            batch_size=24, n_critic=2, precision=precision, backend="xla", lr_d=1e-3, lr_g=1e-3
        )
        sharded = trainer.Trainer(config, *problem())
        state, metrics = sharded.run(sharded.init(), 3)
        runs[precision] = (state, metrics)
    naive = NaiveTrainer(config, *problem())
    ref_state, ref = naive.run(naive.init(), 3)
    (_, f32), (bf_state, bf) = runs["f32"], runs["bf16"]
    losses = ("critic_loss", "penalty", "wasserstein", "generator_loss")
    return {
        "finite": bool(
            all(np.all(np.isfinite(bf[k])) for k in losses)
            and all(np.all(np.isfinite(x)) for x in jax.tree.leaves(bf_state))
        ),
        "vs_f32": {k: check.max_rel_diff(bf[k], np.asarray(f32[k])[..., 0]) for k in losses},
        "vs_naive_bf16": {k: check.max_rel_diff(bf[k], ref[k]) for k in losses},
        "params_vs_naive_bf16": check.max_rel_diff(bf_state.d_params, ref_state.d_params),
    }


@scenario
def wrong_reduction(devices):
    """The check on deliberately broken reductions: it must report them."""
    results = {}
    honest_mean, honest_count = distributed.global_mean, distributed.global_count

    def psum_twice(values, axis_name=None):  # the loss summed over cores once more
        return jax.lax.psum(honest_mean(values, axis_name), axis_name)

    def per_core_mean(values, axis_name=None):  # the penalty divided by the per-core batch only
        return honest_mean(values, None)

    def per_core_count(local_batch, axis_name=None):
        return honest_count(local_batch, None)

    honest_grad, honest_penalty = trainer._packed_value_and_grad, gradient_penalty_and_norms

    def scaled_grad(*args, **kwargs):  # every gradient 1.0001 times too large
        value, grads = honest_grad(*args, **kwargs)
        return value, jax.tree.map(lambda g: 1.0001 * g, grads)

    def r1_penalty(*args, **kwargs):  # the wrong kind of penalty
        return honest_penalty(*args, **{**kwargs, "kind": "r1"})

    patches = {
        "psum_twice_loss": [(trainer, "global_mean", psum_twice)],
        "scaled_gradients": [(trainer, "_packed_value_and_grad", scaled_grad)],
        "wrong_kind": [(penalties, "gradient_penalty_and_norms", r1_penalty)],
        "per_core_penalty": [
            (penalty_api, "global_mean", per_core_mean),
            (second_order, "global_mean", per_core_mean),
            (second_order, "global_count", per_core_count),
        ],
    }
    for name, replacements in patches.items():
        originals = [(module, attr, getattr(module, attr)) for module, attr, _ in replacements]
        for module, attr, broken in replacements:
            setattr(module, attr, broken)
        try:
            results[name] = check.run_check(devices, 2, 24, backend="xla", n_critic=2)
        finally:
            for module, attr, original in originals:
                setattr(module, attr, original)
    return results


@scenario
def aot(devices):
    """Compile one whole sharded critic step and a fused run for a 4-chip TPU v5e mesh."""
    from jax.experimental import topologies
    from jax.sharding import Mesh

    devs = topologies.get_topology_desc("v5e:2x2", "tpu").devices
    mesh = Mesh(np.array(devs), ("data",))
    out = {"platform": devs[0].platform, "devices": len(devs)}  # type: ignore[attr-defined]
    for backend in ("auto", "pallas"):
        config = TrainConfig(batch_size=32, n_critic=2, backend=backend)
        out[backend] = _aot_kernels(mesh, config)
    return out


def _aot_kernels(mesh, config):
    """Whether the compiled critic step and fused run of the toy problem contain a Mosaic call."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from fastgp.train.trainers.state import init_state

    sharded = trainer.Trainer(config, *problem(), mesh=mesh)

    def spec(tree, partition):
        sharding = NamedSharding(mesh, partition)
        return jax.tree.map(
            lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), tree
        )

    state = spec(jax.eval_shape(lambda: init_state(config, *problem()[:2])), P())
    real = spec(jax.ShapeDtypeStruct((config.batch_size, 2), jnp.float32), P("data"))
    step = spec(jax.ShapeDtypeStruct((), jnp.int32), P())
    critic_step = sharded.critic_step.lower(state, real, step).compile().as_text() or ""
    fused_run = sharded.run.lower(state, 2).compile().as_text() or ""
    return {"critic_step": "tpu_custom_call" in critic_step, "run": "tpu_custom_call" in fused_run}


def _kernel_signatures(stablehlo: str):
    """[(operand types, result types)] of every Mosaic kernel call in a StableHLO module."""
    calls = re.findall(r"@tpu_custom_call\(.*\} : \((.*)\) -> (.*)$", stablehlo, re.MULTILINE)
    dtypes = functools.partial(re.findall, r"x([a-z]\w*)>")  # tensor<8x64xbf16> -> bf16
    return [(dtypes(operands), dtypes(results)) for operands, results in calls]


@scenario
def aot_precision(devices):
    """Kernel signatures of the digits problem's critic step and fused run, lowered for a 4-chip
    TPU v5e mesh, per backend ("auto", "pallas") and precision."""
    from jax.experimental import topologies
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from fastgp.train.models.networks import conv_critic, conv_generator
    from fastgp.train.trainers.state import index_sampler, init_state

    devs = topologies.get_topology_desc("v5e:2x2", "tpu").devices
    mesh = Mesh(np.array(devs), ("data",))
    images = np.zeros((16, 8, 8, 1), np.float32)
    networks = (conv_generator(8, channels=8), conv_critic(8))
    out = {}
    for backend, precision in itertools.product(("auto", "pallas"), ("f32", "bf16")):
        config = TrainConfig(
            batch_size=32,
            n_critic=2,
            backend=backend,  # type: ignore[arg-type]
            precision=precision,  # type: ignore[arg-type]
            latent_dim=8,
        )
        sharded = trainer.Trainer(config, *networks, index_sampler(images), mesh=mesh)

        def spec(tree, partition):
            sharding = NamedSharding(mesh, partition)
            return jax.tree.map(
                lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), tree
            )

        # Traced at once, in this iteration: the late binding of config is not an issue.
        state = spec(jax.eval_shape(lambda: init_state(config, *networks)), P())  # noqa: B023
        real = spec(jax.ShapeDtypeStruct((config.batch_size, 8, 8, 1), jnp.float32), P("data"))
        step = spec(jax.ShapeDtypeStruct((), jnp.int32), P())
        out[f"{backend} {precision}"] = {
            "critic_step": _kernel_signatures(
                sharded.critic_step.lower(state, real, step).as_text()
            ),
            "run": _kernel_signatures(sharded.run.lower(state, 2).as_text()),
        }
    return out


if __name__ == "__main__":
    print(json.dumps(SCENARIOS[sys.argv[1]](len(jax.devices()))), flush=True)
