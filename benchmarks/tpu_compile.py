"""Ahead-of-time compile whole critic steps for TPU through libtpu and record compiler estimates.

    JAX_PLATFORMS=cpu python benchmarks/tpu_compile.py [--quick]

For v5e and v6e (one chip) and a 4-chip v5e mesh (``shard_map`` over "data", global-batch
semantics), compiles one critic step (critic loss + penalty, value_and_grad wrt params, Adam) of
each critic in ``workloads.CRITICS`` (except the 2-D toy MLP) for each penalty variant, and writes
``compiled.cost_analysis()`` (flops, bytes accessed) and ``compiled.memory_analysis()`` (argument,
output, temp, peak where reported) into ``benchmarks/results/tpu_compile.md`` (+ ``.json``).
These are the compiler's estimates for the program, not measurements on hardware.
``backend="auto"`` lowers the Pallas kernels for TPU; the table says whether the compiled program
contains the Mosaic custom call.
"""

import os
import pathlib
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import json  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import topologies  # noqa: E402
from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import workloads as W  # noqa: E402

OUT = pathlib.Path(__file__).parent / "results" / "tpu_compile.md"
VARIANTS = ["plain", "naive", "fastgp", "fastgp-xla", "fastgp-remat", "fastgp-dots",
            "fastgp-fwd"]
CRITICS = ["mlp3072", "dcgan32"]
TARGETS = [("v5e", "v5e:2x2", 1), ("v6e", "v6e:2x2", 1), ("v5e", "v5e:2x2", 4)]


def structs(spec, sharding_of):
    params, opt_state, real, fake, key = jax.eval_shape(lambda: W.inputs(spec))
    tree = (params, opt_state, real, fake, key)
    specs = (P(), P(), P("data"), P("data"), P())
    return tuple(
        jax.tree.map(lambda s, ps=ps: jax.ShapeDtypeStruct(s.shape, s.dtype,
                                                           sharding=sharding_of(ps)), t)
        for t, ps in zip(tree, specs))


def compile_step(spec, variant, devices):
    if len(devices) == 1:
        sharding = SingleDeviceSharding(devices[0])
        fn = jax.jit(W.critic_step(spec, variant))
        args = structs(spec, lambda ps: sharding)
    else:
        mesh = Mesh(np.array(devices), ("data",))
        step = W.critic_step(spec, variant, axis_name="data")
        fn = jax.jit(jax.shard_map(step, mesh=mesh,
                                   in_specs=(P(), P(), P("data"), P("data"), P()),
                                   out_specs=P(), check_vma=True))
        args = structs(spec, lambda ps: NamedSharding(mesh, ps))
    start = time.perf_counter()
    compiled = fn.lower(*args).compile()
    seconds = time.perf_counter() - start
    cost = compiled.cost_analysis() or {}
    if isinstance(cost, list):
        cost = cost[0] if cost else {}
    mem = compiled.memory_analysis()
    field = lambda name: int(getattr(mem, name, -1)) if mem is not None else -1
    return dict(
        flops=float(cost.get("flops", float("nan"))),
        bytes=float(cost.get("bytes accessed", float("nan"))),
        argument=field("argument_size_in_bytes"), output=field("output_size_in_bytes"),
        alias=field("alias_size_in_bytes"), temp=field("temp_size_in_bytes"),
        peak=field("peak_memory_in_bytes"),
        kernel="tpu_custom_call" in compiled.as_text(), compile_s=seconds)


def mib(n):
    return "n/a" if n < 0 else f"{n / 2**20:.2f}"


def render(records):
    lines = [
        "# TPU compiler estimates for one critic step (AOT from a CPU host via libtpu)",
        "",
        "`compiled.cost_analysis()` and `compiled.memory_analysis()` of the whole critic step",
        "(critic loss + penalty, value_and_grad wrt params, Adam update), f32. These are the XLA",
        "TPU compiler's **estimates** for the program, not hardware measurements. On the 4-chip",
        "mesh the figures are per chip (the per-device program of the SPMD step; batch split 4",
        "ways). `kernel`: the compiled program contains the Pallas (Mosaic) custom call.",
        "MiB = 2^20 bytes; ratios are to the naive step of the same target and critic.",
        "",
        "| target | critic (batch) | variant | GFLOP | flops / naive | GB accessed "
        "| bytes / naive | args MiB | out MiB | temp MiB | peak MiB | peak / naive | kernel "
        "| compile s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        if "error" in r:
            lines.append(f"| {r['target']} | {r['critic']} | {r['variant']} | compile failed: "
                         f"{r['error'][:120]} |||||||||||")
            continue
        base = next((b for b in records if b["target"] == r["target"]
                     and b["critic"] == r["critic"] and b["variant"] == "naive"
                     and "error" not in b), None)
        ratio = lambda k: f"{r[k] / base[k]:.3f}x" if base and base[k] > 0 and r[k] >= 0 else "-"
        lines.append(
            f"| {r['target']} | {r['critic']} ({r['batch']}) | {r['variant']} "
            f"| {r['flops'] / 1e9:.3f} | {ratio('flops')} | {r['bytes'] / 1e9:.4f} "
            f"| {ratio('bytes')} | {mib(r['argument'])} | {mib(r['output'])} "
            f"| {mib(r['temp'])} | {mib(r['peak'])} | {ratio('peak')} "
            f"| {'yes' if r['kernel'] else 'no'} | {r['compile_s']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    quick = "--quick" in argv
    records = []
    for gen, topology, chips in TARGETS[:1] if quick else TARGETS:
        devices = topologies.get_topology_desc(topology, "tpu").devices[:chips]
        target = f"{gen} x{chips}"
        for critic in CRITICS[:1] if quick else CRITICS:
            spec = W.CRITICS[critic]
            for variant in VARIANTS:
                record = dict(target=target, critic=critic, variant=variant, batch=spec.batch)
                try:
                    record.update(compile_step(spec, variant, devices))
                except Exception as err:  # recorded in the table, e.g. a Mosaic error
                    record["error"] = f"{type(err).__name__}: {err}".replace("\n", " ")
                print(json.dumps(record), flush=True)
                records.append(record)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(render(records))
    OUT.with_suffix(".json").write_text(json.dumps(records, indent=1))
    print(f"wrote {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
