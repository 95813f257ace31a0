"""What a study's results file records besides its rows, and how it is written.

provenance()              -> {"machine": ..., "commit": ...} of this run
write(out, result, page)  -> out.json (``result``) and out.md (``page(result)``)
"""

import json
import os
import pathlib
import platform
import subprocess
from collections.abc import Callable
from typing import Any

import jax


def provenance() -> dict[str, str]:
    """The machine (architecture, cores, Python, JAX) and the checkout's short commit."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        cwd=pathlib.Path(__file__).parent,
    ).stdout.strip()
    machine = (
        f"{platform.machine()}, {os.cpu_count()} CPU cores, Python "
        f"{platform.python_version()}, JAX {jax.__version__}"
    )
    return {"machine": machine, "commit": commit}


def write(out: pathlib.Path, result: dict[str, Any], page: Callable[[dict], str]) -> None:
    """``out`` with the suffix .json holds ``result``, with .md its rendered page."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    out.with_suffix(".md").write_text(page(result))
