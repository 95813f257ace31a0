"""Sequence-parallel attention's memory per device on CPU: the ring against the all-gather.

    python -m benchmarks.attention.sequence_memory [--tokens 4096 16384] [--shards 2 4 8]
    -> benchmarks/results/attention/sequence_memory.{json,md}

Two programs of ``fastgp.attention(q, k, v)`` on B = 2 samples, 2 heads of 64, float32, XLA's
blockwise loops: the gradient of ``sum(o ** 2)`` in (q, k, v), and the reverse-over-forward
program of an exact R1 (the gradient of ``sum(jvp(attention, (q, k, v), (q, k, v))[1] ** 2)``).
Each is compiled for one CPU device holding everything, and with the tokens split over n devices:
inside ``shard_map`` (``sample_axis_name``) and under explicit axes, with ``sequence_parallel``
"ring" and "all-gather". The figure is the compiled program's temporaries per device (XLA's
memory analysis) over one device's, set beside 1/n; and the collectives in each program.
"""

import argparse
import os
import sys
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import jax
import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import benchmarks
import fastgp
from benchmarks import records
from benchmarks.tables import markdown_table
from fastgp import _compiled as cf

OUT = benchmarks.RESULTS / "attention" / "sequence_memory"
BATCH, HEADS, HEAD_DIM = 2, 2, 64
COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "collective-permute", "all-to-all")


def programs(attention: Any) -> dict[str, Any]:
    """{name: (q, k, v) -> the program's outputs} for an attention (q, k, v) -> o."""

    def loss(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return jnp.sum(attention(q, k, v) ** 2)

    def r1(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        return jnp.sum(jax.jvp(attention, (q, k, v), (q, k, v))[1] ** 2)

    return {
        "gradient": jax.grad(loss, argnums=(0, 1, 2)),
        "reverse-over-forward": jax.grad(r1, argnums=(0, 1, 2)),
    }


def _collectives(text: str) -> dict[str, int]:
    counts = dict.fromkeys(COLLECTIVES, 0)
    for line in text.splitlines():
        for kind in COLLECTIVES:
            if f" {kind}(" in line or f" {kind}-start(" in line:
                counts[kind] += 1
    return {kind: n for kind, n in counts.items() if n}


def measure(program: Any, *args: jax.Array) -> dict[str, Any]:
    compiled = jax.jit(program).lower(*args).compile()
    figures = cf.figures(compiled)
    return {"temp": figures["temp"], "collectives": _collectives(compiled.as_text() or "")}


def sharded_attention(n: int, mode: str, scheme: str) -> tuple[Any, Any]:
    """(attention over the tokens split on n devices, the placement of its inputs)."""
    devices = jax.devices()[:n]
    if mode == "shard_map":
        mesh = jax.make_mesh((n,), ("seq",), axis_types=(AxisType.Auto,), devices=devices)
        spec = P(None, "seq")
        local = lambda q, k, v: fastgp.attention(
            q, k, v, backend="xla", sample_axis_name="seq", sequence_parallel=scheme
        )
        fn = jax.shard_map(local, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec)
    else:
        mesh = jax.make_mesh((n,), ("seq",), axis_types=(AxisType.Explicit,), devices=devices)
        spec = P(None, "seq")
        fn = lambda q, k, v: fastgp.attention(q, k, v, backend="xla", sequence_parallel=scheme)
    return fn, (mesh, spec)


def run(tokens: int, shards: list[int]) -> list[dict[str, Any]]:
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    args = [jax.random.normal(key, (BATCH, tokens, HEADS, HEAD_DIM)) for key in keys]
    one = lambda q, k, v: fastgp.attention(q, k, v, backend="xla")
    rows = []
    for name, program in programs(one).items():
        base = measure(program, *args)
        rows.append({"tokens": tokens, "program": name, "shards": 1, **base})
        for n in shards:
            for mode in ("shard_map", "explicit"):
                for scheme in ("ring", "all-gather"):
                    fn, (mesh, spec) = sharded_attention(n, mode, scheme)
                    placed = [jax.device_put(x, NamedSharding(mesh, spec)) for x in args]
                    sharded = programs(fn)[name]
                    if mode == "explicit":
                        with jax.set_mesh(mesh):
                            got = measure(sharded, *placed)
                    else:
                        got = measure(sharded, *placed)
                    row = {"tokens": tokens, "program": name, "shards": n, "mode": mode}
                    row |= {"scheme": scheme, **got, "of_one": got["temp"] / base["temp"]}
                    print(row, flush=True)
                    rows.append(row)
    return rows


def markdown(result: dict[str, Any]) -> str:
    rows = result["rows"]
    base = {(r["tokens"], r["program"]): r["temp"] for r in rows if r["shards"] == 1}
    table = []
    for r in rows:
        if r["shards"] == 1:
            continue
        table.append(
            [
                f"{r['tokens']:,}",
                r["program"],
                r["shards"],
                r["mode"],
                r["scheme"],
                f"{r['temp'] / 2**20:.1f}",
                f"{base[(r['tokens'], r['program'])] / 2**20:.1f}",
                f"{r['of_one']:.3f}",
                f"{r['of_one'] * r['shards']:.2f}",
                ", ".join(f"{k} {v}" for k, v in sorted(r["collectives"].items())),
            ]
        )
    head = [
        "T",
        "program",
        "n",
        "mode",
        "scheme",
        "MiB / device",
        "one device MiB",
        "/ one device",
        "x n",
        "collectives",
    ]
    command = "python -m benchmarks.attention.sequence_memory " + " ".join(result["argv"])
    return "\n".join(
        [
            "# Sequence-parallel attention: compiled temporaries per device (CPU)",
            "",
            (
                f"Generated by `{command}`. B = {BATCH}, {HEADS} heads of {HEAD_DIM}, float32, "
                "backend xla, not causal. `/ one device`: the program's temporaries per device "
                "over those of one device holding every token; `x n`: that ratio times n (1.00 "
                "is a perfect 1/n)."
            ),
            "",
            *markdown_table(head, table),
            "",
            f"Machine: {result['machine']}; commit {result['commit']}.",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--shards", type=int, nargs="+", default=[2, 4, 8])
    args = parser.parse_args(argv)
    rows = [row for tokens in args.tokens for row in run(tokens, args.shards)]
    invocation = sys.argv[1:] if argv is None else list(argv)
    result = {"argv": invocation, **records.provenance(), "rows": rows}
    records.write(OUT, result, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
