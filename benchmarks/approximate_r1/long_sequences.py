"""Exact R1 against approximate_r1 on the long ViT critic: CPU step times at 256 and 1024 tokens.

    JAX_PLATFORMS=cpu python -m benchmarks.approximate_r1.long_sequences [--tokens 256 1024]
        [--batch 4] [--rounds 5]
    -> benchmarks/results/approximate_r1/long_sequences.json

The critic is ``zoo.critics.vit_long`` (4x4 patches, dim 256, 4 heads of 64, 2 pre-LN blocks) in
float32. Each variant is one whole critic step (``workloads.critic_step``: the critic loss and its
penalty, value_and_grad over the parameters, Adam), jitted, timed interleaved
(``fastgp.measure.interleaved_times``), with the compiled program's temporaries:

    plain           no penalty
    exact-r1        fastgp.gradient_penalty(kind="r1") at the reals
    approximate-r1  fastgp.approximate_r1 at the reals (sigma workloads.APPROXIMATE_SIGMA)
    wgan-gp         fastgp.gradient_penalty(kind="wgan-gp") at interpolates

each through ``fastgp.attention`` (``fastgp``: its default backend) or through
``jax.nn.dot_product_attention`` (``dpa``: XLA's softmax attention, every T x T array whole).
Lazy R1 every k steps runs k - 1 plain steps and one exact-r1 step (``workloads.lazy_steps``), so
its amortised cost per step, (exact + (k - 1) plain) / k, is derived from these rows when the
tables are rendered. The one-chip TPU figures of the same critic are ``benchmarks.attention.tpu``'s.
"""

import functools
import json
import sys

import jax
import numpy as np

import benchmarks
from benchmarks import harness, records, workloads
from benchmarks.zoo import critics as zoo
from fastgp import attention
from fastgp import measure as cf
from fastgp.measure import interleaved_times

RESULTS = benchmarks.RESULTS / "approximate_r1"
OUT = RESULTS / "long_sequences.json"
ATTENTION = {"fastgp": attention, "dpa": jax.nn.dot_product_attention}
# penalty: its ``workloads.critic_step`` variant ("fastgp" is the default WGAN-GP penalty)
STEPS = {
    "plain": "plain",
    "exact-r1": "exact-r1",
    "approximate-r1": "approximate-r1",
    "wgan-gp": "fastgp",
}
VARIANTS = (
    "fastgp/plain",
    "dpa/plain",
    "fastgp/exact-r1",
    "dpa/exact-r1",
    "fastgp/approximate-r1",
    "dpa/approximate-r1",
    "fastgp/wgan-gp",
)


def critic_spec(tokens: int, variant: str, batch: int) -> workloads.CriticSpec:
    attention_name = variant.split("/")[0]
    return zoo.long_spec(tokens, ATTENTION[attention_name], batch=batch, dtype=np.float32)


def measure(tokens: int, batch: int, rounds: int) -> list[dict]:
    """Per variant: the median step seconds and the compiled temporaries at ``tokens``."""
    calls, temps = {}, {}
    for variant in VARIANTS:
        spec = critic_spec(tokens, variant, batch)
        step = jax.jit(workloads.critic_step(spec, STEPS[variant.split("/")[1]]))
        args = workloads.inputs(spec)
        temps[variant] = cf.figures(step.lower(*args).compile())["temp"]
        calls[variant] = functools.partial(lambda f, a: jax.block_until_ready(f(*a)), step, args)
    samples = interleaved_times(calls, rounds=rounds, warmup=2)
    return [
        {
            "tokens": tokens,
            "batch": batch,
            "variant": variant,
            "seconds": float(np.median(samples[variant])),
            "samples": [round(s, 4) for s in samples[variant]],
            "temp": temps[variant],
        }
        for variant in VARIANTS
    ]


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(__doc__)
    parser.add_argument("--tokens", nargs="+", type=int, default=[256, 1024])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    result = {
        "argv": sys.argv[1:] if argv is None else list(argv),
        **records.provenance(),
        "rounds": args.rounds,
        "rows": [],
    }
    for tokens in args.tokens:
        result["rows"] += measure(tokens, args.batch, args.rounds)
        for row in result["rows"][-len(VARIANTS) :]:
            print(row["tokens"], row["variant"], f"{row['seconds']:.3f} s", flush=True)
        OUT.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
