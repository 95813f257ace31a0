"""GPU kernel bandwidth against a device-to-device copy and the XLA path (run on a CUDA device).

    python -m benchmarks.gpu.bandwidth --out benchmarks/results/gpu/gpu_bandwidth.md

The norm kernel as the penalty runs it (each row split over spans for the device's programs:
``fastgp._gpu.tuned.penalty_programs``), beside one program a row. Bandwidth counts the minimum
HBM bytes: the sum of squares reads g once; the copy reads and writes it. Medians of repeated
timed calls after warm-up, all in one run.
"""

import argparse
import functools
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

import benchmarks
from benchmarks.tables import markdown_table, table_row
from fastgp._gpu import tuned as gpu_tuned
from fastgp.kernels.penalty import gpu as penalty_gpu

SHAPES = [(256, 2), (256, 3072), (256, 3 * 64 * 64), (1024, 3 * 64 * 64), (64, 1 << 20)]


def _xla_sumsq(rows: jax.Array) -> jax.Array:
    """XLA's own per-row float32 sum of squares, the baseline the kernels are held to."""
    x = rows.astype(jnp.float32)
    return jnp.sum(x * x, axis=1)


def median_seconds(fn, *args, repeats=50):
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default=str(benchmarks.RESULTS / "gpu" / "gpu_bandwidth.md"))
    args = parser.parse_args()
    device = jax.devices()[0]
    rows = [
        (
            f"Device: {device.device_kind}; JAX {jax.__version__}. GB/s from minimum bytes; "
            "kernel / XLA is a ratio of times (lower is better); kernel / copy a ratio of GB/s."
        ),
        "",
        *markdown_table(
            [
                "B x D",
                "dtype",
                "spans",
                "copy GB/s",
                "kernel GB/s",
                "one program a row GB/s",
                "XLA GB/s",
                "kernel / XLA",
                "kernel / copy",
            ],
            [],
        ),
    ]
    for batch, features in SHAPES:
        for dtype in (jnp.float32, jnp.bfloat16):
            g = jax.random.normal(jax.random.PRNGKey(0), (batch, features), dtype)
            nbytes = g.size * g.dtype.itemsize
            copy = median_seconds(jax.jit(lambda x: x * 1), g)
            programs = gpu_tuned.penalty_programs()
            split = penalty_gpu.splits(batch, features, g.dtype.itemsize, programs)
            kernel = median_seconds(functools.partial(penalty_gpu.row_sumsq, split=split), g)
            per_row = median_seconds(jax.jit(penalty_gpu.row_sumsq), g)
            xla = median_seconds(jax.jit(_xla_sumsq), g)
            gbs = lambda b, t: f"{b / t / 1e9:.0f}"
            rows.append(
                table_row(
                    [
                        f"{batch} x {features}",
                        jnp.dtype(dtype).name,
                        split.spans,
                        gbs(2 * nbytes, copy),
                        gbs(nbytes, kernel),
                        gbs(nbytes, per_row),
                        gbs(nbytes, xla),
                        f"{kernel / xla:.2f}",
                        f"{nbytes * copy / (2 * nbytes * kernel):.2f}",
                    ]
                )
            )
            print(rows[-1], flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
