"""The TPU figures of each supported JAX: which toolchain compiled a record, how a script's records
join those other toolchains wrote to the same results file, and where two toolchains' figures
differ.

    toolchain()                              -> {"jax": ..., "libtpu": ...} of this process
    merged(json_path, records)               -> the file's records of other toolchains, then these
    of_oldest(records)                       -> the records the oldest JAX among them compiled
    label(record)                            -> "JAX ..., libtpu ..." of the record's toolchain
    differences(records, key, figures)       -> page lines: per newer JAX, each figure that differs
    summary(records, key, figures)           -> a docs sentence: per newer JAX, what differs where

A results file holds one record per program and toolchain. Pages and docs tables render the
oldest JAX's records (pyproject.toml's floor, the one CI pins) and say, for every newer JAX that
compiled the same programs, which figures came out otherwise. Compile seconds are not a figure
of the program and are never compared.
"""

import importlib.metadata
import json
import pathlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax

from benchmarks.tables import markdown_table

Record = dict[str, Any]


def toolchain() -> dict[str, str]:
    """The JAX and libtpu versions this process compiles TPU programs with."""
    return {"jax": jax.__version__, "libtpu": importlib.metadata.version("libtpu")}


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part.isdigit())


def merged(json_path: pathlib.Path, records: Sequence[Record]) -> list[Record]:
    """``json_path``'s records compiled by other JAX versions (oldest first), then ``records``:
    a rerun replaces only its own toolchain's figures."""
    mine = {r["jax"] for r in records}
    earlier = json.loads(json_path.read_text()) if json_path.exists() else []
    kept = [r for r in earlier if r["jax"] not in mine]
    return sorted([*kept, *records], key=lambda r: _version(r["jax"]))


def of_oldest(records: Sequence[Record]) -> list[Record]:
    """The records of the oldest JAX that compiled any of ``records``."""
    oldest = min((r["jax"] for r in records), key=_version)
    return [r for r in records if r["jax"] == oldest]


def label(record: Record) -> str:
    return f"JAX {record['jax']}, libtpu {record['libtpu']}"


def _newer(
    records: Sequence[Record], key: Callable[[Record], tuple]
) -> Iterator[tuple[Record, list[tuple[Record, Record]], list[Record]]]:
    """Per JAX newer than the oldest: one of its records (for its label), its records paired with
    the oldest's of the same program as (oldest, newer), and those the oldest did not compile."""
    by_key = {key(r): r for r in of_oldest(records)}
    oldest = next(iter(by_key.values()))["jax"]
    for version in dict.fromkeys(r["jax"] for r in records if r["jax"] != oldest):
        newer = [r for r in records if r["jax"] == version]
        pairs = [(by_key[key(r)], r) for r in newer if key(r) in by_key]
        yield newer[0], pairs, [r for r in newer if key(r) not in by_key]


def differences(
    records: Sequence[Record],
    key: Callable[[Record], tuple],
    figures: dict[str, Callable[[Record], str]],
) -> list[str]:
    """Page lines: which toolchain compiled the tables above, then for each newer JAX, every
    program whose ``figures`` (name -> the figure formatted as its table prints it) differ from
    the oldest's, or that none do. Programs only one toolchain compiled are named as such."""
    base = of_oldest(records)[0]
    lines = [f"Compiled with {label(base)}."]
    program = lambda r: " ".join(map(str, key(r)))
    for newer, pairs, missing in _newer(records, key):
        rows = [
            [program(new), name, show(old), show(new)]
            for old, new in pairs
            for name, show in figures.items()
            if show(old) != show(new)
        ]
        programs = f"{len(pairs)} program{'' if len(pairs) == 1 else 's'}"
        if rows:
            lines += ["", f"With {label(newer)}, figures of the same {programs} that differ:"]
            head = ["program", "figure", f"JAX {base['jax']}", f"JAX {newer['jax']}"]
            lines += ["", *markdown_table(head, rows)]
        else:
            lines += ["", f"With {label(newer)}: every figure of the same {programs} equal."]
        if missing:
            only = ", ".join(program(r) for r in missing)
            lines.append(f"Compiled with JAX {newer['jax']} only: {only}.")
    return lines


def summary(
    records: Sequence[Record],
    key: Callable[[Record], tuple],
    figures: dict[str, Callable[[Record], str]],
) -> str:
    """One paragraph for the docs: the toolchain of the tables, and per newer JAX which figures
    came out equal in every program both compiled and which differ in how many."""
    text = [f"Compiled with {label(of_oldest(records)[0])}."]
    for newer, pairs, _ in _newer(records, key):
        differ = {
            name: sum(show(old) != show(new) for old, new in pairs)
            for name, show in figures.items()
        }
        same = [name for name, count in differ.items() if count == 0]
        changed = [f"{name} in {count}" for name, count in differ.items() if count]
        sentence = f"With {label(newer)}, of the same {len(pairs)} programs:"
        if same:
            sentence += f" {', '.join(same)} equal in every one"
        if changed:
            sentence += f"{';' if same else ''} differing: {', '.join(changed)}"
        text.append(sentence + ".")
    return " ".join(text)
