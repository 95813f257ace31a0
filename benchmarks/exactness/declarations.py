"""What both exactness studies share to hold a run to its declaration: the flags that set a
configuration's fields, the configuration a run resolves to, and the refusal naming each field
that differs.

    flags_of(fields)             -> the ``fastgp train`` flags that set those TrainConfig fields
    plain(value)                 -> ``value`` as JSON reads it back (tuples as lists)
    differences(declared, resolved) -> [(field, declared, resolved)] where they differ
    UndeclaredConfig(what, differences)   the refusal (a ValueError)
    resolved_run(argv)           -> {"dataset", "config"} that ``fastgp train ARGV`` resolves to
"""

import dataclasses
import json
from typing import Any

from fastgp.train.cli.main import fresh_run
from fastgp.train.config import FLAGS


def plain(value: Any) -> Any:
    """``value`` as JSON reads it back (tuples as lists), so that a record compares equal."""
    return json.loads(json.dumps(value))


def _flag_value(value: Any) -> str:
    """A field's value as its flag takes it: numbers as short as they parse back exactly."""
    if isinstance(value, float):
        short = f"{value:g}"
        return short if float(short) == value else repr(value)
    return str(value)


def flags_of(fields: dict[str, Any]) -> list[str]:
    """The ``fastgp train`` flags that set ``fields`` (a flag without a value for True)."""
    argv: list[str] = []
    for field, value in fields.items():
        flag = FLAGS[field]
        argv += [flag] if value is True else [flag, _flag_value(value)]
    return argv


class UndeclaredConfig(ValueError):
    """A run whose resolved configuration is not its arm's declaration; ``differences`` holds
    (field, declared, resolved) for each field that differs."""

    def __init__(self, what: str, differences: list[tuple[str, Any, Any]]) -> None:
        self.differences = differences
        listed = "; ".join(f"{f}: declared {d!r}, resolved {r!r}" for f, d, r in differences)
        super().__init__(
            f"{what}: the resolved configuration is not the arm's declaration ({listed}); "
            "the run is not added"
        )


def differences(declared: dict[str, Any], resolved: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """(field, declared, resolved) for each field where the two configurations differ."""
    declared, resolved = plain(declared), plain(resolved)
    fields = [*declared, *(f for f in resolved if f not in declared)]
    return [
        (f, declared.get(f), resolved.get(f)) for f in fields if declared.get(f) != resolved.get(f)
    ]


def resolved_run(argv: list[str]) -> dict[str, Any]:
    """What ``fastgp train ARGV`` resolves to on a fresh --out, as its run.json records it."""
    dataset, config = fresh_run(argv)
    return {"dataset": dataset, "config": plain(dataclasses.asdict(config))}


__all__ = ["UndeclaredConfig", "differences", "flags_of", "plain", "resolved_run"]
