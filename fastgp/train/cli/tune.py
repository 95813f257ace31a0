"""``fastgp tune MODULE:FUNCTION``: run ``fastgp.autotune`` on a user's own critic loss.

    fastgp tune mypackage.losses:build [--generation v5e] [--rounds 10] [--rtol 1e-5] [--json F]

``FUNCTION()`` (no arguments) returns ``(critic_loss, params, *args)``: the loss as
``fastgp.autotune`` takes it, ``critic_loss(params, *args, penalty=...) -> scalar``, and concrete
example arguments. ``MODULE`` is an importable module name or a path to a ``.py`` file. Prints
the table and the chosen options; ``--json`` also writes them.
"""

import argparse
import importlib
import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastgp.measure import TOPOLOGIES


class TuneError(Exception):
    """A problem with the command's target, said in one line."""


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Register ``tune`` on the ``fastgp`` command's subparsers."""
    tune = sub.add_parser(
        "tune",
        help="pick the fastest exact gradient-penalty variant for your own critic loss",
        description=__doc__.split("\n\n")[1],
    )
    tune.add_argument(
        "target",
        metavar="MODULE:FUNCTION",
        help="FUNCTION() returns (critic_loss, params, *args); MODULE: a module or a .py file",
    )
    tune.add_argument(
        "--generation",
        choices=tuple(TOPOLOGIES),
        help="rank programs compiled for one chip of this TPU generation (from any host) "
        "instead of timing on this device",
    )
    tune.add_argument("--rounds", type=int, default=10, help="timed rounds per variant")
    tune.add_argument(
        "--rtol",
        type=float,
        default=1e-5,
        help="tolerance of the check against the naive penalty (1e-5 float32, ~1e-2 bfloat16)",
    )
    tune.add_argument("--json", type=Path, help="also write the result here")
    return tune


def _module(name: str) -> Any:
    if name.endswith(".py"):
        path = Path(name)
        if not path.is_file():
            raise TuneError(f"{name}: no such file")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, str(path.parent.resolve()))
        spec.loader.exec_module(module)
        return module
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        raise TuneError(f"cannot import {name!r}: {err}") from None


def load_target(target: str) -> tuple[Callable[..., Any], Any, tuple[Any, ...]]:
    """(critic_loss, params, args) from ``MODULE:FUNCTION``."""
    module_name, colon, function_name = target.rpartition(":")
    if not colon or not module_name or not function_name:
        raise TuneError(f"expected MODULE:FUNCTION, got {target!r}")
    build = getattr(_module(module_name), function_name, None)
    if not callable(build):
        raise TuneError(f"{module_name} has no function {function_name!r}")
    built = build()
    if not isinstance(built, tuple) or len(built) < 2 or not callable(built[0]):
        raise TuneError(
            f"{target}() must return (critic_loss, params, *args) with critic_loss callable, "
            f"got {type(built).__name__}"
        )
    return built[0], built[1], tuple(built[2:])


def _record(tuning: Any) -> dict[str, Any]:
    return {
        "best": tuning.best,
        "measured_on": tuning.measured_on,
        "variants": [
            {
                "variant": None if r.variant is None else r.variant.options(),
                "value_error": r.value_error,
                "gradient_error": r.gradient_error,
                "seconds": r.seconds,
                "problem": r.problem,
                "program": r.program,
            }
            for r in (*tuning.results, tuning.naive)
        ],
    }


def run(args: argparse.Namespace) -> int:
    """The ``tune`` command: 0 with a pick, 2 when the target or its loss is unusable."""
    from fastgp.autotune import autotune

    try:
        critic_loss, params, loss_args = load_target(args.target)
        tuning = autotune(
            critic_loss,
            params,
            *loss_args,
            generation=args.generation,
            rounds=args.rounds,
            rtol=args.rtol,
        )
    except (TuneError, TypeError, ValueError) as err:
        print(f"fastgp tune: error: {err}", file=sys.stderr, flush=True)
        return 2
    print(tuning.table())
    print(
        f"\nbest: gradient_penalty(..., {', '.join(f'{k}={v!r}' for k, v in tuning.best.items())})"
    )
    if args.json:
        args.json.write_text(json.dumps(_record(tuning), indent=1) + "\n")
    return 0


__all__ = ["TuneError", "add_parser", "load_target", "run"]
