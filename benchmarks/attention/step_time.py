"""A ViT critic's WGAN-GP step on CPU: fastgp.attention against JAX's and Flax's attention.

    JAX_PLATFORMS=cpu python -m benchmarks.attention.step_time [--tokens 256 1024] [--rounds 7]
    -> benchmarks/results/attention/step_time_cpu.{json,md}

The critic is the long-sequence ViT of ``benchmarks.zoo.critics.vit_long`` (4x4 patch embedding,
learned positions, 2 pre-LN blocks of 4 heads of 64 with a GELU MLP of width 1,024, the mean over
the tokens, a dense head), float32, batch 4, on (S, S, 3) images with (S / 4)^2 tokens. The step
is ``benchmarks.workloads.critic_step``'s: the WGAN-GP loss (``fastgp.gradient_penalty`` at the
interpolates, so attention is differentiated twice), its parameter gradient and Adam's update.
The arms differ in the critic's attention alone: ``fastgp.attention`` (its default backend, the
blockwise XLA passes on a CPU), ``jax.nn.dot_product_attention`` (JAX's own) and
``flax.linen.dot_product_attention`` (Flax's: two einsums around a float32 softmax, the scores
materialised; what a Flax model runs unless it is handed an ``attention_fn``). All are compiled
once and timed interleaved in one process, each round calling every arm, rotating which goes
first; the figures are the ratios of the medians, fastgp's over each other arm's. The arms'
losses agree to 1e-4 before anything is timed.
"""

import functools
import math
import sys
from typing import Any

import jax
import numpy as np
from flax import linen

import benchmarks
from benchmarks import harness, records, workloads
from benchmarks.zoo import critics as zoo
from fastgp import attention
from fastgp.measure import interleaved_times

OUT = benchmarks.RESULTS / "attention" / "step_time_cpu"
BATCH = 4
TOKENS = (256, 1024)
ATTENTIONS = {
    "fastgp": attention,
    "jax": jax.nn.dot_product_attention,
    "flax": linen.dot_product_attention,
}
OTHERS = ("jax", "flax")


def spec(tokens: int, attention_fn: Any) -> workloads.CriticSpec:
    """The ViT critic at ``tokens`` (a square) with ``attention_fn``, float32, batch BATCH."""
    return zoo.long_spec(tokens, attention_fn, batch=BATCH, dtype=np.float32)


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
    specs = {name: spec(tokens, fn) for name, fn in ATTENTIONS.items()}
    args = workloads.inputs(specs["fastgp"])  # the arms share parameters and data
    steps = {name: jax.jit(workloads.critic_step(s, "fastgp")) for name, s in specs.items()}
    check_agree({name: float(step(*args)[2]) for name, step in steps.items()})
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
