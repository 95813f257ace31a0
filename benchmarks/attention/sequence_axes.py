"""The tokens over two mesh axes: the all-to-all over the inner axis, then the ring over the outer
(what ``sequence_parallel="auto"`` runs when each device's heads are not a multiple of all n
devices but are of the inner axis's), against the ring over all n; memory per CPU device.

    python -m benchmarks.attention.sequence_axes [--tokens 4096 16384] [--shards 4 8]
        [--traded 2] [--heads 2] [--repeats 0] [--out PATH]
    -> benchmarks/results/attention/sequence_axes.{json,md}
    python -m benchmarks.attention.sequence_axes --topology v5e:4x4 --tokens 65536 262144
        --shards 8 16 --traded 4 --heads 4
    -> benchmarks/results/attention/sequence_axes_tpu.{json,md}

The programs, batch and head size of ``benchmarks.attention.sequence_memory`` (the gradient of
``sum(o ** 2)`` and an exact R1's reverse-over-forward program, XLA's loops, float32), inside
``shard_map``: the ring over one axis of n devices, and the same n devices as a (n / U, U) mesh
of ("ring", "traded") axes. Compiled temporaries per device over one device's; x n is 1.00 for a
perfect 1 / n. With ``--repeats``, the fastest of that many runs of each (all n simulated
devices on this machine's cores: the split against the ring, not against a chip). With
``--topology``, the R1 program in bfloat16 with the Mosaic kernels
(``backend="pallas"``), compiled for the slice's chips through libtpu's compile-only client, one
sample per data shard (as ``sequence_memory --topology``): the peak per chip.
"""

import os
import pathlib
import sys
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import jax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import benchmarks
import fastgp
from benchmarks import harness, records
from benchmarks.attention.sequence_memory import (
    BATCH,
    HEAD_DIM,
    attention_inputs,
    collective_counts,
    measure,
    one_device,
    programs,
    tpu_compiled,
)
from benchmarks.tables import markdown_table
from fastgp import measure as cf

OUT = benchmarks.RESULTS / "attention" / "sequence_axes"
OUT_TPU = benchmarks.RESULTS / "attention" / "sequence_axes_tpu"


def layouts(n: int, traded: int) -> dict[str, tuple[tuple[int, ...], tuple[str, ...]]]:
    """{split: (its mesh's shape over the token axes, their names)} for n devices."""
    return {
        "ring": ((n,), ("seq",)),
        "all-to-all then ring": ((n // traded, traded), ("ring", "traded")),
    }


def tpu_rows(topology: str, tokens: int, shards: list[int], traded: int, heads: int) -> list[dict]:
    """The R1 program's peak per chip of ``topology`` for each n and split (see the module)."""
    rows = []
    for n in shards:
        for split, token_mesh in layouts(n, traded).items():
            name = "reverse-over-forward"
            compiled = tpu_compiled(topology, tokens, n, "auto", (name,), token_mesh, heads)[name]
            row = {"topology": topology, "tokens": tokens, "shards": n, "split": split}
            row |= {"peak": cf.figures(compiled)["peak"]}
            row["collectives"] = collective_counts(compiled.as_text() or "")
            print(row, flush=True)
            rows.append(row)
    return rows


def tpu_table(result: dict[str, Any]) -> list[str]:
    """docs/performance.md's table: per T and n, each split's peak per chip and times n."""
    by = {(r["tokens"], r["shards"], r["split"]): r for r in result["rows"]}
    cells = []
    for t, n in sorted({key[:2] for key in by}):
        ring, both = by[(t, n, "ring")], by[(t, n, "all-to-all then ring")]
        cells.append(
            [
                f"{t:,}",
                n,
                f"{ring['peak'] / 2**30:.3f}",
                f"{both['peak'] / 2**30:.3f}",
                f"{both['peak'] / ring['peak']:.2f}",
                ", ".join(f"{k} {v}" for k, v in sorted(both["collectives"].items())),
            ]
        )
    traded = result["traded"]
    head = [
        "T",
        "n",
        "ring over n, GiB / chip",
        f"all-to-all over {traded} then ring over n / {traded}, GiB / chip",
        "its peak / the ring's",
        "its collectives",
    ]
    return markdown_table(head, cells)


def split_attention(shape: tuple[int, ...], names: tuple[str, ...]) -> tuple[Any, Any]:
    """(attention with the tokens over every axis of a ``shape`` mesh, the inputs' sharding)."""
    mesh = jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape))
    spec = P(None, names)
    local = lambda q, k, v: fastgp.attention(q, k, v, backend="xla", sample_axis_name=names)
    fn = jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec)
    return fn, NamedSharding(mesh, spec)


def run(
    tokens: int, shards: list[int], traded: int, heads: int, repeats: int = 0
) -> list[dict[str, Any]]:
    args = attention_inputs(tokens, heads)
    rows = []
    for name, program in programs(one_device).items():
        base = measure(program, *args, repeats=0)["temp"]
        for n in shards:
            layouts = {
                "ring": ((n,), ("seq",)),
                "all-to-all then ring": ((n // traded, traded), ("ring", "traded")),
            }
            for split, (shape, names) in layouts.items():
                fn, sharding = split_attention(shape, names)
                placed = [jax.device_put(x, sharding) for x in args]
                got = measure(programs(fn)[name], *placed, repeats=repeats)
                row = {"tokens": tokens, "program": name, "shards": n, "split": split}
                row |= {**got, "one_device": base, "of_one": got["temp"] / base}
                print(row, flush=True)
                rows.append(row)
    return rows


def table(result: dict[str, Any]) -> list[str]:
    """docs/performance.md's table: per T, program and n, each split's temporaries per device
    over one device's, times n."""
    by = {(r["tokens"], r["program"], r["shards"], r["split"]): r for r in result["rows"]}
    traded = result["traded"]
    cells = []
    for t, program, n in sorted({key[:3] for key in by}):
        ring, both = by[(t, program, n, "ring")], by[(t, program, n, "all-to-all then ring")]
        cells.append(
            [
                f"{t:,}",
                program,
                n,
                f"{ring['of_one'] * n:.2f}",
                f"{both['of_one'] * n:.2f}",
                f"{both['temp'] / ring['temp']:.2f}",
                ", ".join(f"{k} {v}" for k, v in sorted(both["collectives"].items())),
            ]
            + ([f"{both['seconds'] / ring['seconds']:.2f}"] if "seconds" in ring else [])
        )
    head = [
        "T",
        "program",
        "n",
        "ring over n, x n",
        f"all-to-all over {traded} then ring over n / {traded}, x n",
        "its memory / the ring's",
        "its collectives",
    ] + (["its time / the ring's"] if all("seconds" in r for r in result["rows"]) else [])
    return markdown_table(head, cells)


def markdown(result: dict[str, Any]) -> str:
    command = "python -m benchmarks.attention.sequence_axes " + " ".join(result["argv"])
    if "topology" in result:
        return records.page(
            "Sequence-parallel attention over two token axes: peak per chip "
            f"({result['topology']})",
            f"Generated by `{command}`. The R1 program of one sample per data shard, "
            f"{result['heads']} heads of {HEAD_DIM}, bfloat16, the Mosaic kernels, compiled for "
            "the slice's chips (compile-only).",
            tpu_table(result),
            result,
        )
    return records.page(
        "Sequence-parallel attention over two token axes: compiled temporaries per device (CPU)",
        f"Generated by `{command}`. B = {BATCH}, {result['heads']} heads of {HEAD_DIM}, float32, "
        "backend xla, not causal, inside shard_map. `x n`: a program's temporaries per device "
        "over those of one device holding every token, times n (1.00 is a perfect 1 / n).",
        table(result),
        result,
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = harness.parser(__doc__)
    parser.add_argument("--tokens", nargs="+", type=int, default=[4096, 16384])
    parser.add_argument("--shards", nargs="+", type=int, default=[4, 8])
    parser.add_argument("--traded", type=int, default=2)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=0, help="timed runs of each (CPU)")
    parser.add_argument("--out", type=pathlib.Path)
    parser.add_argument("--topology", help="compile for this TPU slice, e.g. v5e:4x4")
    args = parser.parse_args(argv)
    result: dict[str, Any] = {
        "argv": sys.argv[1:] if argv is None else argv,
        **records.provenance(),
        "heads": args.heads,
        "traded": args.traded,
        "rows": [],
    }
    for tokens in args.tokens:
        if args.topology:
            result["topology"] = args.topology
            result["rows"] += tpu_rows(args.topology, tokens, args.shards, args.traded, args.heads)
        else:
            result["rows"] += run(tokens, args.shards, args.traded, args.heads, args.repeats)
    records.write(args.out or (OUT_TPU if args.topology else OUT), result, markdown)
    return result


if __name__ == "__main__":
    main()
