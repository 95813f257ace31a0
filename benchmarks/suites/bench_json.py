"""The pytest-benchmark results file (``make bench``'s bench.json), as both reports read it.

load(path)       -> (the file's data, {group: [benchmark records]})
kind_of(group)   -> the group's kind, the part before its first ":"
"""

import json
import pathlib
from typing import Any


def load(path: str | pathlib.Path) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    data = json.loads(pathlib.Path(path).read_text())
    groups: dict[str, list[dict[str, Any]]] = {}
    for b in data["benchmarks"]:
        groups.setdefault(b["group"], []).append(b)
    return data, groups


def kind_of(group: str) -> str:
    return group.split(":", 1)[0]


__all__ = ["kind_of", "load"]
