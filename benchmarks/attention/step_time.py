"""A ViT critic's WGAN-GP step on CPU: fastgp.attention against JAX's and Flax's attention.

    JAX_PLATFORMS=cpu python -m benchmarks.attention.step_time [--tokens 256 1024] [--rounds 7]
    -> benchmarks/results/attention/step_time_cpu.{json,md}

The critic is a big_vision-style ViT (4x4 patch embedding, 2 pre-LN blocks of 4 heads of 64
with a GELU MLP of width 1,024, the mean over the tokens, a dense head), float32, batch 4, on
(S, S, 3) images with (S / 4)^2 tokens. The step is the critic's WGAN-GP update: the loss's and
the penalty's gradient in the parameters, the penalty's input gradient taken by ``jax.grad`` at
the interpolates, so it differentiates through attention twice. The arms differ in the
attention alone: ``fastgp.attention`` (its default backend, the blockwise XLA passes on a CPU),
``jax.nn.dot_product_attention`` (JAX's own) and ``flax.linen.dot_product_attention`` (Flax's:
two einsums around a float32 softmax, the scores materialised; what a Flax model runs unless it
is handed an ``attention_fn``). All are compiled once and timed interleaved in one process, each
round calling every arm, rotating which goes first; the figures are the ratios of the medians,
fastgp's over each other arm's. The arms' losses agree to 1e-4 before anything is timed.
"""

import functools
import math
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen

import benchmarks
from benchmarks import harness, records
from fastgp import attention
from fastgp.measure import interleaved_times

OUT = benchmarks.RESULTS / "attention" / "step_time_cpu"
BATCH, DIM, HEADS, DEPTH, PATCH = 4, 256, 4, 2, 4
TOKENS = (256, 1024)
ATTENTIONS = {
    "fastgp": attention,
    "jax": jax.nn.dot_product_attention,
    "flax": linen.dot_product_attention,
}
OTHERS = ("jax", "flax")


def _dense(key: jax.Array, fan_in: int, fan_out: int) -> dict[str, jax.Array]:
    w = jax.random.normal(key, (fan_in, fan_out), jnp.float32) / math.sqrt(fan_in)
    return {"w": w, "b": jnp.zeros((fan_out,), jnp.float32)}


def init(key: jax.Array) -> dict[str, Any]:
    """The critic's parameters: the patch embedding, DEPTH blocks, the head."""
    keys = iter(jax.random.split(key, 2 + 4 * DEPTH))
    norm = lambda: {"scale": jnp.ones((DIM,)), "bias": jnp.zeros((DIM,))}
    blocks = [
        {
            "norm1": norm(),
            "qkv": _dense(next(keys), DIM, 3 * DIM),
            "proj": _dense(next(keys), DIM, DIM),
            "norm2": norm(),
            "mlp_in": _dense(next(keys), DIM, 4 * DIM),
            "mlp_out": _dense(next(keys), 4 * DIM, DIM),
        }
        for _ in range(DEPTH)
    ]
    embed = _dense(next(keys), PATCH * PATCH * 3, DIM)
    return {"embed": embed, "blocks": blocks, "norm": norm(), "head": _dense(next(keys), DIM, 1)}


def _layer_norm(h: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
    mean = jnp.mean(h, -1, keepdims=True)
    var = jnp.mean((h - mean) ** 2, -1, keepdims=True)
    return (h - mean) * jax.lax.rsqrt(var + 1e-6) * p["scale"] + p["bias"]


def _apply(p: dict[str, jax.Array], h: jax.Array) -> jax.Array:
    return h @ p["w"] + p["b"]


def critic(attention_fn: Any, params: dict[str, Any], x: jax.Array) -> jax.Array:
    """(B,) scores of (B, S, S, 3) images; ``attention_fn(q, k, v)`` on (B, T, H, D)."""
    b, s = x.shape[0], x.shape[1]
    n = s // PATCH
    patches = x.reshape(b, n, PATCH, n, PATCH, 3).transpose(0, 1, 3, 2, 4, 5)
    h = _apply(params["embed"], patches.reshape(b, n * n, PATCH * PATCH * 3))
    for block in params["blocks"]:
        qkv = _apply(block["qkv"], _layer_norm(h, block["norm1"]))
        q, k, v = jnp.split(qkv.reshape(b, n * n, 3 * HEADS, DIM // HEADS), 3, axis=2)
        h = h + _apply(block["proj"], attention_fn(q, k, v).reshape(b, n * n, DIM))
        mlp = jax.nn.gelu(_apply(block["mlp_in"], _layer_norm(h, block["norm2"])))
        h = h + _apply(block["mlp_out"], mlp)
    return _apply(params["head"], jnp.mean(_layer_norm(h, params["norm"]), 1))[:, 0]


def wgan_gp_step(attention_fn: Any) -> Any:
    """(params, real, fake, key) -> (loss, parameter gradients) of WGAN-GP at weight 10."""
    score = functools.partial(critic, attention_fn)

    def loss(params: dict[str, Any], real: jax.Array, fake: jax.Array, key: jax.Array):
        t = jax.random.uniform(key, (real.shape[0], 1, 1, 1))
        points = t * real + (1 - t) * fake
        g = jax.grad(lambda x: jnp.sum(score(params, x)))(points)
        norms = jnp.sqrt(jnp.sum(g.reshape(g.shape[0], -1) ** 2, -1))
        gap = jnp.mean(score(params, fake)) - jnp.mean(score(params, real))
        return gap + 10.0 * jnp.mean((norms - 1.0) ** 2)

    return jax.jit(jax.value_and_grad(loss))


def check_agree(losses: dict[str, float]) -> None:
    """Raises AssertionError, naming every arm's loss, unless the other arms' agree with
    fastgp's to 1e-4 (float32 sums in other orders)."""
    if not all(math.isclose(losses["fastgp"], losses[o], rel_tol=1e-4) for o in OTHERS):
        raise AssertionError(f"the arms compute different losses: {losses}")


def measure(tokens: int, rounds: int) -> dict[str, Any]:
    """The row of one token count: each arm's median seconds and fastgp's over each other arm's.
    ValueError unless ``tokens`` is a square (the patches tile a square image)."""
    if tokens < 1 or math.isqrt(tokens) ** 2 != tokens:
        raise ValueError(f"--tokens takes squares (a square image of 4x4 patches), got {tokens}")
    side = PATCH * math.isqrt(tokens)
    key = jax.random.PRNGKey(0)
    params = init(key)
    real, fake = jax.random.normal(key, (2, BATCH, side, side, 3))
    args = (params, real, fake, jax.random.PRNGKey(1))
    steps = {name: wgan_gp_step(fn) for name, fn in ATTENTIONS.items()}
    check_agree({name: float(step(*args)[0]) for name, step in steps.items()})
    calls = {
        name: functools.partial(lambda f: jax.block_until_ready(f(*args)), step)
        for name, step in steps.items()
    }
    samples = interleaved_times(calls, rounds=rounds, warmup=2)
    medians = {name: float(np.median(times)) for name, times in samples.items()}
    ratios = {f"over_{o}": medians["fastgp"] / medians[o] for o in OTHERS}
    return {"tokens": tokens, **medians, **ratios}


def table(result: dict[str, Any]) -> list[str]:
    """The results' markdown table: each arm's median step (ms) and fastgp's ratios."""
    head = "| tokens | fastgp.attention (ms) | jax.nn.dot_product_attention (ms) "
    head += "| flax.linen.dot_product_attention (ms) | fastgp over JAX's | fastgp over Flax's |"
    rows = [
        f"| {r['tokens']:,} | "
        + " | ".join(f"{1e3 * r[name]:,.0f}" for name in ATTENTIONS)
        + " | "
        + " | ".join(f"{r[f'over_{o}']:.2f}x" for o in OTHERS)
        + " |"
        for r in result["rows"]
    ]
    return [head, "|---:|---:|---:|---:|---:|---:|", *rows]


def page(result: dict[str, Any]) -> str:
    intro = (
        f"`python -m benchmarks.attention.step_time {' '.join(result['argv'])}`: "
        f"median of {result['rounds']} interleaved rounds of each arm's WGAN-GP critic step "
        f"(batch {BATCH}, float32; the module's docstring describes the critic)."
    )
    return records.page("A ViT critic's WGAN-GP step on CPU", intro, table(result), result)


def main(argv: list[str] | None = None) -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS))
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    invocation = sys.argv[1:] if argv is None else argv
    result = {"argv": invocation, "rounds": args.rounds, **records.provenance(), "rows": []}
    for tokens in args.tokens:
        result["rows"].append(measure(tokens, args.rounds))
        print(result["rows"][-1], flush=True)
    records.write(OUT, result, page)


if __name__ == "__main__":
    main()
