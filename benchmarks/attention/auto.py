"""The figures behind attention's ``backend="auto"`` on each platform.

    JAX_PLATFORMS=cpu python -m benchmarks.attention.auto [--rounds 5]
    -> benchmarks/results/attention/auto_cpu.json

TPU: the long ViT critic's WGAN-GP step with the Mosaic kernels (``flash/fastgp``) against the
blockwise XLA loops (``flash-xla/fastgp``), compiled for one chip by ``benchmarks.attention.tpu``
(``attention_tpu.json``): peak memory and bytes. XLA's cost analysis counts a while loop's body
once, so the XLA rows' bytes and flops are lower bounds; the peak is the compiler's allocation.
CPU: the same step on ``zoo.critics.vit32`` (64 tokens, float32, batch 8) timed interleaved with
XLA and with the kernels in Pallas interpret mode, the only way they run on a CPU. GPU: the same
step on the device with the Triton kernels and with the XLA loops, timed interleaved by
``benchmarks.gpu.attention`` (``benchmarks/gpu/check.sh``; ``benchmarks/results/gpu/``).
"""

import functools
import json
import os
import sys

import jax
import numpy as np

import benchmarks
from benchmarks import harness, workloads
from benchmarks.attention.tpu import probe_batch
from benchmarks.tables import markdown_table
from benchmarks.zoo import critics as zoo
from fastgp import attention
from fastgp.measure import interleaved_times
from fastgp.options import auto_backend

RESULTS = benchmarks.RESULTS / "attention"
CPU_BACKENDS = ("xla", "interpret")


def cpu_times(rounds: int) -> dict:
    """Median seconds of vit32's WGAN-GP critic step per attention backend."""
    calls = {}
    for backend in CPU_BACKENDS:
        model = zoo.vit32(attention_fn=functools.partial(attention, backend=backend))
        spec = workloads.CriticSpec("vit32", model, 8, (32, 32, 3), np.float32)
        step, args = jax.jit(workloads.critic_step(spec, "fastgp")), workloads.inputs(spec)
        calls[backend] = functools.partial(lambda f, a: jax.block_until_ready(f(*a)), step, args)
    samples = interleaved_times(calls, rounds=rounds, warmup=1)
    return {backend: float(np.median(samples[backend])) for backend in CPU_BACKENDS}


def gpu_rows(gpu: dict) -> list[list[str]]:
    """The table's rows of ``benchmarks.gpu.attention``'s result: the long ViT's WGAN-GP step
    timed on the device with the Triton kernels and with the XLA loops, where both ran."""
    steps = {(r["tokens"], r["variant"]): r for r in gpu["rows"] if "step_ms" in r}
    rows = []
    for tokens, _ in sorted(k for k in steps if k[1] == "fastgp-xla/wgan-gp"):
        kernels = steps.get((tokens, "fastgp/wgan-gp"))
        loops = steps[tokens, "fastgp-xla/wgan-gp"]
        if kernels is None:
            continue
        rows.append(
            [
                f"{gpu['device']}, T = {tokens:,} (batch {loops['batch']})",
                f"{kernels['step_ms']:,.1f} ms, {kernels['peak'] / 2**30:.2f} GiB",
                f"{loops['step_ms']:,.1f} ms, {loops['peak'] / 2**30:.2f} GiB",
                f"{kernels['step_ms'] / loops['step_ms']:.2f}x (time)",
                auto_backend("attention", "cuda"),
            ]
        )
    return rows


def table(records: list[dict], cpu: dict, gpu: dict) -> list[str]:
    """docs/performance.md's table: per platform, what each backend costs and what auto runs;
    ``gpu`` is ``benchmarks.gpu.attention``'s (merged) result."""
    rows = []
    fitted = {
        (r["generation"], r["tokens"], r["variant"]): r
        for r in records
        if r["fits"] and r["batch"] == probe_batch(r["tokens"])
    }
    for generation, tokens, _ in sorted(k for k in fitted if k[2] == "flash-xla/fastgp"):
        kernels = fitted.get((generation, tokens, "flash/fastgp"))
        loops = fitted[generation, tokens, "flash-xla/fastgp"]
        if kernels is None:
            continue
        rows.append(
            [
                f"{generation}, T = {tokens:,} (batch {loops['batch']})",
                f"{kernels['peak'] / 2**30:.2f} GiB, {kernels['bytes'] / 1e9:.1f} GB",
                f"{loops['peak'] / 2**30:.2f} GiB, >= {loops['bytes'] / 1e9:.1f} GB",
                f"{kernels['peak'] / loops['peak']:.2f}x",
                auto_backend("attention", "tpu"),
            ]
        )
    rows += gpu_rows(gpu)
    rows.append(
        [
            "CPU, vit32 (64 tokens, batch 8)",
            f"{cpu['times']['interpret'] * 1e3:,.0f} ms (interpret mode)",
            f"{cpu['times']['xla'] * 1e3:,.0f} ms",
            f"{cpu['times']['interpret'] / cpu['times']['xla']:.1f}x (time)",
            auto_backend("attention", "cpu"),
        ]
    )
    head = ["platform, critic step", "kernels", "XLA loops", "kernels / XLA (peak)", "auto runs"]
    return markdown_table(head, rows)


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    result = {
        "argv": sys.argv[1:] if argv is None else list(argv),
        "machine": f"{os.cpu_count()} CPU cores, JAX {jax.__version__}",
        "rounds": args.rounds,
        "times": cpu_times(args.rounds),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "auto_cpu.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
