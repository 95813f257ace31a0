"""Compile whole critic steps for TPU ahead of time and record the compiled programs' figures.

    JAX_PLATFORMS=cpu ALLOW_MULTIPLE_LIBTPU_LOAD=1 python -m benchmarks.tpu.compile [--quick]

For v5e, v6e and TPU7x (one chip each), compiles one critic step (critic loss + penalty,
value_and_grad wrt params, Adam) of each critic in ``workloads.TPU_CRITICS`` with the naive
penalty, with fastgp's default (``backend="auto"``: XLA on TPU) and with the Pallas kernel
forced (``backend="pallas"``), and writes flops, bytes accessed, copy ops and memory
(``fastgp.measure``) to ``benchmarks/results/tpu/tpu_compile.md`` (+ ``.json``). These are the
compiler's figures for the program, not hardware times. ``--quick``: v5e and the first critic.
"""

import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import json

import jax

import benchmarks
from benchmarks import workloads as W
from benchmarks.tables import markdown_table
from benchmarks.tpu import versions
from fastgp import measure as cf

OUT = benchmarks.RESULTS / "tpu" / "tpu_compile.md"
GENERATIONS = ("v5e", "v6e", "7x")


def variants(spec):
    """naive, the default (XLA on TPU), and the Pallas kernel forced."""
    return ("naive", "fastgp", "fastgp-pallas")


def step_structs(spec):
    return jax.eval_shape(lambda: W.inputs(spec))


def measure(generation, spec, variant):
    start = time.perf_counter()
    compiled = cf.compile_for(
        cf.tpu_device(generation), W.critic_step(spec, variant), *step_structs(spec)
    )
    return dict(cf.figures(compiled), compile_s=time.perf_counter() - start)


def ratio(record, base, key):
    return f"{record[key] / base[key]:.4f}x" if base else "-"


# What a program's figures are, as the page prints them (compile seconds are not among them).
FIGURES = {
    "GFLOP": lambda r: f"{r['flops'] / 1e9:.3f}",
    "MB accessed": lambda r: f"{r['bytes'] / 1e6:.2f}",
    "copy": lambda r: str(r["copies"]),
    "copy-start": lambda r: str(r["async_copies"]),
    "temp MiB": lambda r: f"{r['temp'] / 2**20:.2f}",
    "kernel": lambda r: "yes" if r["kernel"] else "no",
}


def program(record):
    return (record["generation"], record["critic"], record["variant"])


def render(all_records):
    records = versions.of_oldest(all_records)
    lines = [
        "# Compiled whole critic steps for TPU (AOT from a CPU host via libtpu)",
        "",
        "One critic step: critic loss + penalty at interpolates, value_and_grad wrt params, Adam.",
        "`flops`, `bytes`: XLA's cost analysis of the compiled program. `copy`: copy ops outside",
        "fusions (relayouts, moves between memory spaces); `copy-start`: asynchronous prefetches",
        "scheduled by memory-space assignment. `temp`: the memory analysis' temporary buffers",
        "(argument and output sizes are the same for every variant of a critic). Compiler",
        "figures, not hardware times; ratios are to the naive step of the same generation and",
        "critic. `kernel`: the program contains the Mosaic (Pallas TPU) call. fastgp is the",
        (
            'default (`backend="auto"`: XLA on TPU; reverse-over-forward); `-pallas` forces the '
            "kernel."
        ),
        "",
    ]
    rows = []
    for r in records:
        base = next((b for b in records if program(b) == (*program(r)[:2], "naive")), None)
        rows.append(
            [
                r["generation"],
                f"{r['critic']} ({r['batch']}, {r['dtype']})",
                r["variant"],
                f"{r['flops'] / 1e9:.3f}",
                ratio(r, base, "flops"),
                f"{r['bytes'] / 1e6:.2f}",
                ratio(r, base, "bytes"),
                r["copies"],
                r["async_copies"],
                f"{r['temp'] / 2**20:.2f}",
                "yes" if r["kernel"] else "no",
                f"{r['compile_s']:.0f}",
            ]
        )
    head = [
        "generation",
        "critic (batch, dtype)",
        "variant",
        "GFLOP",
        "flops / naive",
        "MB accessed",
        "bytes / naive",
        "copy",
        "copy-start",
        "temp MiB",
        "kernel",
        "compile s",
    ]
    changes = versions.differences(all_records, program, FIGURES)
    return "\n".join([*lines, *markdown_table(head, rows), "", *changes]) + "\n"


def table(all_records):
    """performance.md's table, from the oldest JAX's records: per generation and critic, fastgp's
    default and its Pallas step over the naive step (bytes, flops) and the copy ops of all three."""
    records = versions.of_oldest(all_records)
    rows = []
    for naive in (r for r in records if r["variant"] == "naive"):
        same = {
            r["variant"]: r
            for r in records
            if (r["generation"], r["critic"]) == (naive["generation"], naive["critic"])
        }
        default, pallas = same["fastgp"], same["fastgp-pallas"]
        rows.append(
            [
                naive["generation"],
                f"{naive['critic']} ({naive['batch']}, {naive['dtype']})",
                ratio(default, naive, "bytes"),
                ratio(pallas, naive, "bytes"),
                f"{ratio(default, naive, 'flops')} / {ratio(pallas, naive, 'flops')}",
                f"{naive['copies']} / {default['copies']} / {pallas['copies']}",
            ]
        )
    head = [
        "generation",
        "critic (batch, dtype)",
        "bytes: fastgp",
        "bytes: fastgp-pallas",
        "flops: fastgp / -pallas",
        "copy ops naive / fastgp / -pallas",
    ]
    return markdown_table(head, rows)


def versions_summary(all_records):
    """performance.md's line under the table: which JAX compiled it, what a newer one changed."""
    return versions.summary(all_records, program, FIGURES)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    quick = "--quick" in argv
    generations = GENERATIONS[:1] if quick else GENERATIONS
    critics = list(W.TPU_CRITICS)[:1] if quick else list(W.TPU_CRITICS)
    records = []
    for generation in generations:
        for name in critics:
            spec = W.TPU_CRITICS[name]
            for variant in variants(spec):
                record = dict(
                    generation=generation,
                    critic=name,
                    variant=variant,
                    batch=spec.batch,
                    dtype=jax.numpy.dtype(spec.dtype).name,
                    **versions.toolchain(),
                )
                record.update(measure(generation, spec, variant))
                print(json.dumps(record), flush=True)
                records.append(record)
    records = versions.merged(OUT.with_suffix(".json"), records)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(render(records))
    OUT.with_suffix(".json").write_text(json.dumps(records, indent=1))
    print(f"wrote {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
