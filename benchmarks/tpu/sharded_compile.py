"""Compile sharded whole critic steps for TPU meshes ahead of time; compare each chip's program with
the single-chip program of its share of the batch.

    JAX_PLATFORMS=cpu ALLOW_MULTIPLE_LIBTPU_LOAD=1 \
        python -m benchmarks.tpu.sharded_compile [--quick]

One bf16 WGAN-GP critic step (critic loss + penalty at interpolates, value_and_grad wrt params,
Adam) of an NHWC conv critic (``workloads.meanpool_critic``: 3x3 stride-1 convs, 2x2 mean-pool)
at a global batch of 256, under ``jax.jit`` with NamedSharding on
an explicit mesh (``jax.make_mesh``'s default axis types, ``jax.set_mesh``): no shard_map in the
user's code. Meshes: 4 chips with the batch over ``data`` (v5e, v6e, TPU7x) and 8 v5p chips as a
4 x 2 ``(data, model)`` mesh with the image height over ``model``. Variants: naive, fastgp's
default (XLA on TPU) and ``backend="pallas"``. Each chip's flops and bytes (XLA's cost analysis of
the partitioned program) are divided by those of the same variant compiled for one chip at the
per-chip batch (64, or 32 on the 8-chip mesh); collectives are counted in arrays carried
(``tpu.sharded_compile.collectives``). Writes ``benchmarks/results/tpu/tpu_sharded_compile.md``
(+ ``.json``). ``--quick``: v5e only.
"""

import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import json
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import benchmarks
from benchmarks import workloads as W
from benchmarks.tables import markdown_table
from benchmarks.tpu import versions
from benchmarks.tpu.collectives import arrays_moved, collective_ops
from fastgp import measure as cf

OUT = benchmarks.RESULTS / "tpu" / "tpu_sharded_compile.md"
GLOBAL_BATCH = 256
CRITIC = W.CriticSpec(
    "meanpool32-bf16", W.meanpool_critic(32, 32), GLOBAL_BATCH, (32, 32, 3), jnp.bfloat16
)
# name: (topology, mesh shape, axis names, x's PartitionSpec)
MESHES = {
    "v5e": ("v5e:2x2", (4,), ("data",), P("data")),
    "v5p": ("v5p:2x2x2", (4, 2), ("data", "model"), P("data", "model")),
    "v6e": ("v6e:2x2", (4,), ("data",), P("data")),
    "7x": ("TPU7x:2x2x1", (4,), ("data",), P("data")),
}
VARIANTS = ("naive", "fastgp", "fastgp-pallas")


def collectives(hlo_text: str) -> dict:
    """Arrays moved by each kind of collective, and ``gathered``: the all-gathers' result shapes."""
    counts: dict = {
        kind: arrays_moved(hlo_text, kind)
        for kind in ("all-reduce", "all-gather", "all-to-all", "collective-permute")
    }
    counts["gathered"] = [
        shape for kind, shape, _ in collective_ops(hlo_text) if kind == "all-gather"
    ]
    return counts


def mesh_for(name):
    topology, shape, names, _ = MESHES[name]
    devices = np.array(cf.tpu_devices(topology)[: int(np.prod(shape))]).reshape(shape)
    return Mesh(devices, names, axis_types=(AxisType.Explicit,) * len(names))


def step_structs(spec, mesh=None, x_spec=None):
    """ShapeDtypeStructs of the step's inputs; on a mesh, params/opt/key replicated and real/fake
    placed with ``x_spec``."""
    params, opt_state, real, fake, key = jax.eval_shape(lambda: W.inputs(spec))
    if mesh is None:
        return params, opt_state, real, fake, key
    place = lambda tree, ps: jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(mesh, ps)), tree
    )
    return (
        place(params, P()),
        place(opt_state, P()),
        place(real, x_spec),
        place(fake, x_spec),
        place(key, P()),
    )


def compile_sharded(name, variant, spec=CRITIC):
    """The step of ``spec`` (a CriticSpec; its batch is the global batch) on mesh ``name``."""
    mesh, x_spec = mesh_for(name), MESHES[name][3]
    with jax.set_mesh(mesh):
        return (
            jax.jit(W.critic_step(spec, variant)).lower(*step_structs(spec, mesh, x_spec)).compile()
        )


def compile_one_chip(name, variant):
    chips = int(np.prod(MESHES[name][1]))
    spec = CRITIC._replace(batch=GLOBAL_BATCH // chips)
    device = cf.tpu_devices(MESHES[name][0])[0]
    return cf.compile_for(device, W.critic_step(spec, variant), *step_structs(spec))


def measure(name, variant):
    start = time.perf_counter()
    sharded = compile_sharded(name, variant)
    one = compile_one_chip(name, variant)
    figures, single = cf.figures(sharded), cf.figures(one)
    return dict(
        mesh=name,
        topology=MESHES[name][0],
        axes=MESHES[name][2],
        x_spec=str(MESHES[name][3]),
        variant=variant,
        flops=figures["flops"],
        bytes=figures["bytes"],
        single_flops=single["flops"],
        single_bytes=single["bytes"],
        kernel=figures["kernel"],
        **collectives(sharded.as_text()),
        compile_s=time.perf_counter() - start,
        **versions.toolchain(),
    )


# What a program's figures are, as the page prints them.
FIGURES: dict[str, Callable[[dict], str]] = {
    "GFLOP per chip": lambda r: f"{r['flops'] / 1e9:.3f}",
    "MB per chip": lambda r: f"{r['bytes'] / 1e6:.2f}",
    "GFLOP one chip": lambda r: f"{r['single_flops'] / 1e9:.3f}",
    "MB one chip": lambda r: f"{r['single_bytes'] / 1e6:.2f}",
    "all-reduce": lambda r: str(r["all-reduce"]),
    "all-gather": lambda r: str(r["all-gather"]),
    "all-to-all": lambda r: str(r["all-to-all"]),
    "permute": lambda r: str(r["collective-permute"]),
    "kernel": lambda r: "yes" if r["kernel"] else "no",
}


def program(record):
    return (record["mesh"], record["variant"])


def render(all_records):
    records = versions.of_oldest(all_records)
    lines = [
        "# Sharded critic steps compiled for TPU meshes (AOT from a CPU host via libtpu)",
        "",
        (
            f"bf16 NHWC conv critic (32x32x3; 3x3 stride-1 convs of 32-64-128 channels, each "
            f"followed by 2x2 mean-pooling; a dense head), global batch {GLOBAL_BATCH}: one "
            "critic step (critic loss + penalty, value_and_grad, Adam) under `jax.jit` with"
        ),
        (
            "NamedSharding on an explicit mesh (no shard_map in the step). `per chip / 1 chip`: "
            "each chip's flops and bytes accessed (XLA's cost analysis of the partitioned "
            "program) over"
        ),
        (
            "those of the same variant compiled for one chip at the per-chip batch. Collectives: "
            "arrays carried per step. `kernel`: the Mosaic call is in the program."
        ),
        "",
    ]
    rows = []
    for r in records:
        shape = "x".join(map(str, MESHES[r["mesh"]][1]))
        mesh = f"{r['topology']} ({shape} over {', '.join(r['axes'])})"
        rows.append(
            [
                mesh,
                r["x_spec"],
                r["variant"],
                f"{r['flops'] / 1e9:.3f}",
                f"{r['flops'] / r['single_flops']:.4f}x",
                f"{r['bytes'] / 1e6:.2f}",
                f"{r['bytes'] / r['single_bytes']:.4f}x",
                r["all-reduce"],
                r["all-gather"],
                r["all-to-all"],
                r["collective-permute"],
                "yes" if r["kernel"] else "no",
            ]
        )
    head = [
        "mesh",
        "x sharding",
        "variant",
        "GFLOP per chip",
        "flops / 1 chip",
        "MB per chip",
        "bytes / 1 chip",
        "all-reduce",
        "all-gather",
        "all-to-all",
        "permute",
        "kernel",
    ]
    changes = versions.differences(all_records, program, FIGURES)
    return "\n".join([*lines, *markdown_table(head, rows), "", *changes]) + "\n"


def table(all_records):
    """performance.md's table, from the oldest JAX's records: per mesh, each variant's per-chip
    flops and bytes over one chip's at the per-chip batch, and its collectives (naive / fastgp /
    fastgp-pallas in each cell)."""
    records = versions.of_oldest(all_records)
    rows = []
    for name in dict.fromkeys(r["mesh"] for r in records):
        by_variant = {r["variant"]: r for r in records if r["mesh"] == name}
        each = [by_variant[v] for v in VARIANTS]
        first = each[0]
        cell = lambda fn, each=each: " / ".join(fn(r) for r in each)
        shape = "x".join(map(str, MESHES[name][1]))
        rows.append(
            [
                f"{first['topology']} ({shape} over {', '.join(first['axes'])})",
                first["x_spec"],
                " / ".join(VARIANTS),
                cell(lambda r: f"{r['flops'] / r['single_flops']:.4f}x"),
                cell(lambda r: f"{r['bytes'] / r['single_bytes']:.4f}x"),
                cell(lambda r: str(r["all-reduce"])),
                cell(lambda r: str(r["all-gather"])),
                cell(lambda r: str(r["collective-permute"])),
                cell(lambda r: "yes" if r["kernel"] else "no"),
            ]
        )
    head = ["mesh", "x sharding", "variant", "flops / 1 chip", "bytes / 1 chip"]
    head += ["all-reduce", "all-gather", "permute", "kernel"]
    return markdown_table(head, rows)


def versions_summary(all_records):
    """performance.md's line under the table: which JAX compiled it, what a newer one changed."""
    return versions.summary(all_records, program, FIGURES)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    names = ["v5e"] if "--quick" in argv else list(MESHES)
    records = []
    for name in names:
        for variant in VARIANTS:
            record = measure(name, variant)
            print(json.dumps(record), flush=True)
            records.append(record)
    records = versions.merged(OUT.with_suffix(".json"), records)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(render(records))
    OUT.with_suffix(".json").write_text(json.dumps(records, indent=1))
    print(f"wrote {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
