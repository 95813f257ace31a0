"""The exactness study's training step compiled for one TPU chip: its flops and bytes per row.

    JAX_PLATFORMS=cpu ALLOW_MULTIPLE_LIBTPU_LOAD=1 python -m benchmarks.exactness.compiled
        [--rows r3gan apt-r1r2 ...] [--tokens 49 196] [--generation v5e] [--fresh]
    -> benchmarks/results/exactness/compiled.{json,md}

One step is one generator iteration: the row's ``n_critic`` critic steps and the generator step,
as ``fastgp train --dataset mnist --critic vit --vit-patch P`` runs it with the row's flags of
``study.rows`` (parsed by the command's own parser, ``--backend auto``: the program a TPU runs,
the ViT's attention in fastgp's Mosaic kernels), at the recipe's batch of 64 on a one-chip mesh
of a compile-only ``generation`` device (libtpu from this CPU host). The ViT takes 49 tokens at
patch 4 and 196 at patch 2. Figures are XLA's cost analysis of the compiled program ("flops",
"bytes accessed"; a Mosaic call counts what its cost estimate declares).

What XLA's cost analysis counts decides which program each figure comes from (``PROGRAMS``):

* ``fused``: ``Trainer.run`` lowered for one iteration, as the TPU runs it. Its critic steps are
  a ``lax.scan``, and the cost analysis counts a loop's body once whatever its trip count: with
  ``n_critic`` 1 XLA drops the loop and the figure is one step; with more it is one critic step
  and the generator step.
* ``written-out``: ``Trainer.iteration``, the same iteration with its critic steps written out
  (no loop): the per-step figure of a row with ``n_critic`` > 1 (wgan-gp).
* ``penalty``, ``no penalty``: a lazy row's (``gp_every`` k > 1) fused program with the schedule
  fixed at trace time to take, or skip, the penalty. The row's own program decides under a
  ``lax.cond``, which the cost analysis counts as the costlier branch, not both nor their mean;
  the per-step figure is the amortised (1/k) penalty + (1 - 1/k) no penalty.

Compiles take minutes on a small host: each is kept in the json as it finishes and reused on the
next run with the same flags (``--fresh``: compile every one again).
"""

import json
import os
import sys
import time
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import benchmarks
from benchmarks import harness, records
from benchmarks.exactness import study
from benchmarks.tables import markdown_table
from fastgp import measure as cf
from fastgp.train.cli.parser import build_parser, overrides
from fastgp.train.config import TrainConfig
from fastgp.train.recipes import defaults as recipes
from fastgp.train.trainers import trainer
from fastgp.train.trainers.state import init_state

OUT = benchmarks.RESULTS / "exactness" / "compiled"
DATASET = "mnist"
PATCHES = {49: 4, 196: 2}  # tokens of the 28 x 28 ViT -> its patch side
BASE = "r3gan"  # the row the others are relative to
STEPS = 300  # --steps (the study's vary by row): the cosine weight's length, not the cost
PROGRAMS = ("fused", "written-out", "penalty", "no penalty")


WHAT = (
    "One step is one generator iteration (the row's critic steps and the generator step) of "
    "`fastgp train --dataset mnist --critic vit` with the row's flags "
    "(`benchmarks/exactness/study.py`) at the recipe's batch of 64, float32, `--backend auto` "
    "(the ViT's attention in fastgp's Mosaic kernels), compiled for a one-chip mesh from this CPU "
    "host by libtpu's compile-only client. 49 tokens: `--vit-patch 4`; 196: `--vit-patch 2`. "
    'GFLOP and GB: XLA\'s cost analysis ("flops", "bytes accessed"; a Mosaic call counts its '
    f"declared cost estimate). `/ {BASE}`: over the {BASE} row at the same tokens. `roofline`: "
    "max(flops / bf16 peak, bytes / HBM bandwidth) at the chip's published figures, a lower "
    "bound and not a time (the step runs in float32)."
)
WHICH = (
    "Which program a figure comes from: the fused run of one iteration when the row takes one "
    "critic step (XLA drops the one-trip loop); the iteration with its critic steps written out "
    "when it takes more (wgan-gp's 3: the cost analysis counts a loop's body once, so its fused "
    "run reads as one critic step plus the generator step); for stylegan2-lazy, 1/16 of the "
    "fused program with the penalty plus 15/16 of it without, each fixed at trace time. The "
    "row's own program chooses under a `lax.cond`, which the cost analysis counts as its "
    "costlier branch (its flops are the penalty step's), not as both branches nor their mean."
)
COLUMNS = (
    "`loops`: XLA while loops left in the program; `conditionals`: `lax.cond`s; `peak`: the "
    "memory analysis' most HBM live at once; `Mosaic calls`: kernel calls in the program text; "
    "`commit`: the checkout compiled (a compile on record is reused when the flags are the same)."
)


def argv_of(row: str, tokens: int, weight: float = 1.0) -> list[str]:
    """The ``fastgp train`` flags of ``row`` at ``tokens`` (those the study passes that set the
    step's program; ``weight``: the study's --weight)."""
    return [
        *("--dataset", DATASET, "--critic", "vit", "--vit-patch", str(PATCHES[tokens])),
        *("--steps", str(STEPS), "--backend", "auto"),
        *study.rows(weight)[row],
    ]


def config_of(argv: list[str]) -> TrainConfig:
    """The TrainConfig ``fastgp train`` builds from ``argv`` on a fresh run."""
    args = build_parser().parse_args(["train", *argv])
    return recipes.default_config(DATASET, **overrides(args))


def programs_of(config: TrainConfig) -> tuple[str, ...]:
    """The programs compiled for ``config`` (module docstring), the per-step one's last."""
    if config.gp_every > 1:
        if config.n_critic > 1:
            raise NotImplementedError("a lazy penalty with n_critic > 1 is not amortised here")
        return ("fused", "penalty", "no penalty")
    return ("fused", "written-out") if config.n_critic > 1 else ("fused",)


class _FixedPenalty(trainer.Trainer):
    """A trainer whose every critic step takes (``apply_gp``) or skips the penalty, decided at
    trace time (no ``lax.cond``), at the weight the row's schedule gives the step."""

    def __init__(self, *args: Any, apply_gp: bool, **kwargs: Any) -> None:
        self._apply_gp = apply_gp
        super().__init__(*args, **kwargs)

    def _schedule(self, state: Any, step: Any) -> tuple[Any, Any]:
        return self._apply_gp, super()._schedule(state, step)[1]


def compile_program(config: TrainConfig, program: str, generation: str) -> dict[str, Any]:
    """The figures (``cf.figures``, conditionals, compile seconds) of ``program`` for ``config``
    on one chip of ``generation``."""
    device = cf.tpu_device(generation)
    mesh = Mesh(np.array([device]), (trainer.AXIS,))
    problem = recipes.build_problem(DATASET, config)
    networks = (config, problem.generator, problem.critic, problem.sample_real)
    step: trainer.Trainer
    if program in ("penalty", "no penalty"):
        step = _FixedPenalty(*networks, mesh=mesh, fused=True, apply_gp=program == "penalty")
    else:
        step = trainer.Trainer(*networks, mesh=mesh, fused=True)
    replicated = NamedSharding(mesh, P())
    state = jax.tree.map(
        lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=replicated),
        jax.eval_shape(lambda: init_state(config, problem.generator, problem.critic)),
    )
    start = time.perf_counter()
    with jax.default_device(device):
        if program == "written-out":
            compiled = step.iteration.lower(state).compile()
        else:
            compiled = step.run.lower(state, 1).compile()
    seconds = time.perf_counter() - start
    figures = cf.figures(compiled)
    return {
        **figures,
        "conditionals": (compiled.as_text() or "").count(" conditional("),
        "roofline_s": cf.roofline_s(figures, generation),
        "compile_s": seconds,
        "commit": records.provenance()["commit"],
    }


def per_step(config: TrainConfig, compiles: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One step's flops, bytes and roofline from a row's ``compiles`` {program: figures}, and
    the program(s) they come from."""
    keys = ("flops", "bytes", "roofline_s")
    if config.gp_every > 1:
        every = config.gp_every
        on, off = compiles["penalty"], compiles["no penalty"]
        step = {key: (on[key] + (every - 1) * off[key]) / every for key in keys}
        return {**step, "from": f"1/{every} penalty + {every - 1}/{every} no penalty"}
    source = "written-out" if config.n_critic > 1 else "fused"
    return {**{key: compiles[source][key] for key in keys}, "from": source}


def measure(rows, tokens, generation, weight, earlier, save) -> list[dict[str, Any]]:
    """Every row at every token count: its flags, config, compiles and per-step figures. A
    compile of the same generation, flags and program in ``earlier`` is reused; ``save(found)``
    is called after each new one."""
    found: list[dict[str, Any]] = []
    for count in tokens:
        for row in rows:
            argv = argv_of(row, count, weight)
            config = config_of(argv)
            entry = {"row": row, "tokens": count, "argv": argv, "n_critic": config.n_critic}
            entry.update(gp_every=config.gp_every, compiles={})
            found.append(entry)
            for program in programs_of(config):
                key = (generation, tuple(argv), program)
                if key not in earlier:
                    earlier[key] = compile_program(config, program, generation)
                    figures = earlier[key]
                    print(
                        f"{row} {count} tokens {program}: {figures['flops'] / 1e9:.2f} GFLOP, "
                        f"{figures['bytes'] / 1e9:.2f} GB ({figures['compile_s']:.0f} s)",
                        flush=True,
                    )
                entry["compiles"][program] = earlier[key]
                if program == programs_of(config)[-1]:
                    entry["step"] = per_step(config, entry["compiles"])
                save(found)
    return found


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.3f}x" if base else "-"


def _step_cells(done: list[dict[str, Any]]) -> list[list[Any]]:
    """Per row and token count, one step's figures and their ratio to r3gan's (a lazy row's
    three programs each)."""
    base = {e["tokens"]: e["step"] for e in done if e["row"] == BASE}
    cells = []
    for e in done:
        lines = [(e["row"], e["step"])]
        if e["gp_every"] > 1:
            lines += [(f"{e['row']}: {p} step", e["compiles"][p]) for p in PROGRAMS[2:]]
        for label, figures in lines:
            ref = base.get(e["tokens"], {})
            cells.append(
                [
                    label,
                    e["tokens"],
                    f"{figures['flops'] / 1e9:.2f}",
                    _ratio(figures["flops"], ref.get("flops", 0)),
                    f"{figures['bytes'] / 1e9:.3f}",
                    _ratio(figures["bytes"], ref.get("bytes", 0)),
                    f"{figures['roofline_s'] * 1e6:.0f}",
                ]
            )
    return cells


def _compile_cells(done: list[dict[str, Any]]) -> list[list[Any]]:
    """Every program compiled, with its figures, time and commit."""
    return [
        [
            e["row"],
            e["tokens"],
            program,
            f"{f['flops'] / 1e9:.2f}",
            f"{f['bytes'] / 1e9:.3f}",
            f"{f['peak'] / 2**20:.0f}",
            f["loops"],
            f["conditionals"],
            f["kernels"],
            f"{f['compile_s']:.0f}",
            f.get("commit", "-"),
        ]
        for e in done
        for program, f in e["compiles"].items()
    ]


def markdown(result: dict[str, Any]) -> str:
    """The page: per row and token count one step's figures relative to r3gan's, then every
    program compiled."""
    done = [e for e in result["rows"] if "step" in e]
    total = sum(f["compile_s"] for e in done for f in e["compiles"].values())
    command = " ".join(
        ["JAX_PLATFORMS=cpu ALLOW_MULTIPLE_LIBTPU_LOAD=1 python -m benchmarks.exactness.compiled"]
        + result["argv"]
    )
    head = ["row", "tokens", "GFLOP / step", f"/ {BASE}", "GB / step", f"/ {BASE}", "roofline us"]
    compiled_head = [
        *("row", "tokens", "program", "GFLOP", "GB", "peak MiB", "loops", "conditionals"),
        *("Mosaic calls", "compile s", "commit"),
    ]
    chip = result["generation"]
    title = f"# The exactness study's training step compiled for one TPU {chip} chip"
    return "\n".join(
        [
            title,
            "",
            f"Generated by `{command}` on {result['machine']} (commit {result['commit']}).",
            "",
            WHAT,
            "",
            WHICH,
            "",
            *markdown_table(head, _step_cells(done)),
            "",
            f"## Every program compiled ({total:.0f} s of compiling in all)",
            "",
            COLUMNS,
            "",
            *markdown_table(compiled_head, _compile_cells(done)),
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = harness.parser(__doc__)
    parser.add_argument("--rows", nargs="+", choices=study.ROWS, default=list(study.ROWS))
    parser.add_argument("--tokens", nargs="+", type=int, choices=PATCHES, default=list(PATCHES))
    parser.add_argument("--generation", default="v5e", choices=tuple(cf.CHIPS))
    parser.add_argument("--weight", type=float, default=1.0, help="the study's --weight")
    parser.add_argument("--fresh", action="store_true", help="compile again what is on record")
    args = parser.parse_args(argv)
    earlier: dict[tuple, dict[str, Any]] = {}
    if OUT.with_suffix(".json").exists() and not args.fresh:
        found = json.loads(OUT.with_suffix(".json").read_text())
        for e in found["rows"]:
            for program, figures in e["compiles"].items():
                figures.setdefault("commit", found["commit"])  # the checkout it compiled
                earlier[(e["generation"], tuple(e["argv"]), program)] = figures
    result: dict[str, Any] = {
        "argv": sys.argv[1:] if argv is None else list(argv),
        **records.provenance(),
        "generation": args.generation,
        "batch": recipes.default_config(DATASET, critic="vit").batch_size,
        "rows": [],
    }

    def save(found: list[dict[str, Any]]) -> None:
        result["rows"] = [{**e, "generation": args.generation} for e in found]
        records.write(OUT, result, markdown)

    measure(args.rows, args.tokens, args.generation, args.weight, earlier, save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
