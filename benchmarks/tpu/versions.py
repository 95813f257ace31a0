"""The TPU figures of each supported JAX: which toolchain compiled a record, how a script's records
join those other toolchains wrote to the same results file, and where two toolchains' figures
differ.

    toolchain()                              -> {"jax": ..., "libtpu": ...} of this process
    merged(json_path, records)               -> the file's records of other toolchains, then these
    of_oldest(records)                       -> the records the oldest JAX among them compiled
    differences(records, key, figures)       -> page lines: per newer JAX, each figure that differs

A results file holds one record per program and toolchain. Pages and docs tables render the
oldest JAX's records (pyproject.toml's floor, the one CI pins) and say, for every newer JAX that
compiled the same programs, which figures came out otherwise. Compile seconds are not a figure
of the program and are never compared.
"""

import importlib.metadata
import json
import pathlib
from collections.abc import Callable, Sequence
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


def differences(
    records: Sequence[Record],
    key: Callable[[Record], tuple],
    figures: dict[str, Callable[[Record], str]],
) -> list[str]:
    """Page lines: which toolchain compiled the tables above, then for each newer JAX, every
    program whose ``figures`` (name -> the figure formatted as its table prints it) differ from
    the oldest's, or that none do. Programs only one toolchain compiled are named as such."""
    base = of_oldest(records)
    lines = [f"Compiled with {label(base[0])}."]
    by_key = {key(r): r for r in base}
    for version in dict.fromkeys(r["jax"] for r in records if r["jax"] != base[0]["jax"]):
        newer = [r for r in records if r["jax"] == version]
        rows, missing = [], []
        for r in newer:
            old = by_key.get(key(r))
            if old is None:
                missing.append(" ".join(map(str, key(r))))
                continue
            for name, show in figures.items():
                if show(old) != show(r):
                    rows.append([" ".join(map(str, key(r))), name, show(old), show(r)])
        count = len(newer) - len(missing)
        programs = f"{count} program{'' if count == 1 else 's'}"
        if rows:
            lines += ["", f"With {label(newer[0])}, figures of the same {programs} that differ:"]
            head = ["program", "figure", f"JAX {base[0]['jax']}", f"JAX {version}"]
            lines += ["", *markdown_table(head, rows)]
        else:
            lines += ["", f"With {label(newer[0])}: every figure of the same {programs} equal."]
        if missing:
            lines.append(f"Compiled with JAX {version} only: {', '.join(missing)}.")
    return lines


def summary(
    records: Sequence[Record],
    key: Callable[[Record], tuple],
    figures: dict[str, Callable[[Record], str]],
) -> str:
    """One paragraph for the docs: the toolchain of the tables, and per newer JAX which figures
    came out equal in every program both compiled and which differ in how many."""
    base = of_oldest(records)
    by_key = {key(r): r for r in base}
    text = [f"Compiled with {label(base[0])}."]
    for version in dict.fromkeys(r["jax"] for r in records if r["jax"] != base[0]["jax"]):
        pairs = [(by_key[key(r)], r) for r in records if r["jax"] == version and key(r) in by_key]
        differ = {
            name: sum(show(old) != show(new) for old, new in pairs)
            for name, show in figures.items()
        }
        same = [name for name, count in differ.items() if count == 0]
        changed = [f"{name} in {count}" for name, count in differ.items() if count]
        newer = next(r for r in records if r["jax"] == version)
        sentence = f"With {label(newer)}, of the same {len(pairs)} programs:"
        if same:
            sentence += f" {', '.join(same)} equal in every one"
        if changed:
            sentence += f"{';' if same else ''} differing: {', '.join(changed)}"
        text.append(sentence + ".")
    return " ".join(text)
