"""Collectives in the trainer's compiled steps: count, kind and bytes, per mesh and TPU topology.

    JAX_PLATFORMS=cpu python -m benchmarks.tpu.collectives     # CPU meshes + TPU topologies
    -> benchmarks/results/tpu/collectives.md (+ .json)

Each figure is read from a compiled program (``compiled.as_text()``), for one critic step
(``Trainer.critic_step``) and one generator iteration (``Trainer.run`` of one iteration, which
holds ``n_critic`` critic steps and the generator step). TPU programs are compiled ahead of time
from this host with libtpu's compile-only client (``get_topology_desc``), for 4, 64 and 256 chips.
"""

import collections
import json
import os
import re
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import benchmarks
from benchmarks.tables import markdown_table, table_row

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
# "name = shape kind(" where shape is an array shape or a parenthesised tuple of them.
_OP = re.compile(r"=\s*(\(.*?\)|\S+)\s+(" + "|".join(COLLECTIVES) + r")(?:-start)?\(")
# One array of a shape: "f32[4,8]" -> ("f32", "4,8"); "f32[]" -> ("f32", "").
_ARRAY = re.compile(r"([a-z]+\d*)\[([\d,]*)\]")
_BYTES = {
    "f32": 4,
    "s32": 4,
    "u32": 4,
    "bf16": 2,
    "f16": 2,
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "f64": 8,
    "s64": 8,
    "u64": 8,
}


def _shape_bytes(shape: str) -> int:
    """Bytes of an HLO result shape such as ``f32[4,8]{1,0}`` or a tuple ``(f32[2], s32[])``."""
    total = 0
    for dtype, dims in _ARRAY.findall(shape):
        total += _BYTES.get(dtype, 4) * int(np.prod([int(d) for d in dims.split(",") if d]))
    return total


# The functions below read an HLO module's text as ``Compiled.as_text()`` gives it (typed
# ``str | None``; None holds no collective).


def count_collectives(hlo_text: str | None) -> dict:
    """{kind: {"count": n, "bytes": b}} of the collective ops in an HLO module's text.

    Async pairs (``all-reduce-start`` / ``-done``) count once, by their start.
    """
    found: collections.defaultdict[str, dict[str, int]] = collections.defaultdict(
        lambda: {"count": 0, "bytes": 0}
    )
    for shape, kind in _OP.findall(hlo_text or ""):
        found[kind]["count"] += 1
        found[kind]["bytes"] += _shape_bytes(shape)
    return dict(found)


def operand_shapes(hlo_text: str | None) -> list:
    """Shapes (``"f32[33537]"``, ``"f32[]"``, ...) of every array the collective ops of an HLO
    module's text move, a tuple's each."""
    return [m.group(0) for shape, _ in _OP.findall(hlo_text or "") for m in _ARRAY.finditer(shape)]


# "name = shape kind(operands)": the operand list is what an op moves, also for the async
# "-start" forms, whose result tuple also holds context buffers.
_OP_OPERANDS = re.compile(r"= ([^\n]*?) (" + "|".join(COLLECTIVES) + r")(?:-start)?\(([^)]*)\)")


def collective_ops(hlo_text: str | None) -> list[tuple[str, str, int]]:
    """(kind, result shape, arrays moved) of each collective op of an HLO module's text. XLA's
    combiner packs several arrays into one op, so compare arrays moved, not op counts."""
    return [
        (match.group(2), match.group(1), len(match.group(3).split(",")))
        for match in _OP_OPERANDS.finditer(hlo_text or "")
    ]


def arrays_moved(hlo_text: str | None, kind: str) -> int:
    """Arrays moved by the ``kind`` ops (all-reduce, all-gather, ...) of an HLO module's text."""
    return sum(moved for op, _, moved in collective_ops(hlo_text) if op == kind)


def count_operands(hlo_text: str | None) -> int:
    """Arrays moved by all the collective ops of an HLO module's text (a tuple counts each)."""
    return len(operand_shapes(hlo_text))


# (label, topology or None for this host's CPU devices, chips)
MESHES = [
    ("CPU, 4 devices", None, 4),
    ("TPU v5e 2x2", "v5e:2x2", 4),
    ("TPU v5p 4x4x4", "v5p:4x4x4", 64),
    ("TPU v5e 16x16", "v5e:16x16", 256),
]
PER_CHIP_BATCH = 8


def _devices(topology):
    if topology is None:
        return jax.devices()[:4]
    from jax.experimental import topologies

    return topologies.get_topology_desc(topology, "tpu").devices


def compile_steps(dataset: str, topology) -> dict:
    """{"critic step": collectives, "generator iteration": collectives} of one compiled program."""
    from fastgp.train.recipes.defaults import build_problem, default_config
    from fastgp.train.trainers.state import init_state
    from fastgp.train.trainers.trainer import Trainer

    devices = _devices(topology)
    mesh = Mesh(np.array(devices), ("data",))
    config = default_config(dataset, batch_size=PER_CHIP_BATCH * len(devices), backend="auto")
    problem = build_problem(dataset, config)
    trainer = Trainer(config, problem.generator, problem.critic, problem.sample_real, mesh=mesh)

    def spec(tree, partition):
        sharding = NamedSharding(mesh, partition)
        return jax.tree.map(
            lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), tree
        )

    state = spec(jax.eval_shape(lambda: init_state(config, problem.generator, problem.critic)), P())
    sample = jax.eval_shape(
        lambda k: problem.sample_real(k, config.batch_size), jax.random.PRNGKey(0)
    )
    real = spec(jax.ShapeDtypeStruct(sample.shape, jnp.float32), P("data"))
    step = spec(jax.ShapeDtypeStruct((), jnp.int32), P())
    critic = trainer.critic_step.lower(state, real, step).compile().as_text()
    iteration = trainer.run.lower(state, 1).compile().as_text()
    written_out = trainer.iteration.lower(state).compile().as_text()
    return {
        "critic step": count_collectives(critic),
        "generator iteration": count_collectives(iteration),
        "written-out iteration": count_collectives(written_out),
        "written-out operands": count_operands(written_out),
        "n_critic": config.n_critic,
        "global batch": config.batch_size,
    }


def _cell(found: dict) -> str:
    if not found:
        return "none"
    return ", ".join(f"{v['count']} {k} ({v['bytes']:,} B)" for k, v in sorted(found.items()))


def main() -> int:
    results = []
    lines = [
        "# Collectives per compiled training step",
        "",
        (
            "Read from compiled programs (`python -m benchmarks.tpu.collectives`): one critic "
            "step, and one"
        ),
        (
            "generator iteration (`n_critic` critic steps in a scan, whose body is counted once, "
            "plus the"
        ),
        "generator step), and the same iteration written out (each critic step counted: what runs",
        "per iteration) with the arrays its collectives move (a tuple operand counts each).",
        f"Global batch = {PER_CHIP_BATCH} per chip. TPU programs are compiled ahead of time from a",
        "CPU host with libtpu (`get_topology_desc`).",
        "",
        *markdown_table(
            [
                "model",
                "mesh",
                "chips",
                "critic step",
                "generator iteration",
                "written out",
                "operands",
            ],
            [],
        ),
    ]
    for dataset in ("8gaussians", "digits"):
        for label, topology, chips in MESHES:
            try:
                found = compile_steps(dataset, topology)
            except Exception as err:  # a topology this libtpu cannot build is reported, not hidden
                found = {"error": f"{type(err).__name__}: {str(err)[:200]}"}
            results.append({"dataset": dataset, "mesh": label, "chips": chips, **found})
            if "error" in found:
                lines.append(table_row([dataset, label, chips, found["error"], "", "", ""]))
            else:
                lines.append(
                    table_row(
                        [
                            dataset,
                            label,
                            chips,
                            _cell(found["critic step"]),
                            _cell(found["generator iteration"]),
                            _cell(found["written-out iteration"]),
                            found["written-out operands"],
                        ]
                    )
                )
            print(lines[-1], flush=True)
    out = benchmarks.RESULTS / "tpu"
    out.mkdir(parents=True, exist_ok=True)
    (out / "collectives.md").write_text("\n".join(lines) + "\n")
    (out / "collectives.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
