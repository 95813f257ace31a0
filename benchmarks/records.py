"""What a study's results file records besides its rows, and how it is written.

provenance()                     -> {"machine": ..., "commit": ...} of this run
write(out, result, page)         -> out.json (``result``) and out.md (``page(result)``)
runs(out, invocation, append)    -> a study of one row per run, started or continued
add_run(out, result, row, page)  -> the row printed, kept and both files written
page(title, intro, body, result) -> a results page: heading, how it was made, body, provenance
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
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            cwd=pathlib.Path(__file__).parent,
        ).stdout.strip()
    except OSError:  # no git on the machine
        commit = ""
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


def page(title: str, intro: str, body: list[str], result: dict[str, Any]) -> str:
    """A results page: ``# title``, ``intro`` (the command that made it), the ``body`` lines, and
    the machine and commit of ``result``."""
    return "\n".join(
        [
            f"# {title}",
            "",
            intro,
            "",
            *body,
            "",
            f"Machine: {result['machine']}; commit {result['commit']}.",
            "",
        ]
    )


def runs(out: pathlib.Path, invocation: list[str], append: bool) -> dict[str, Any]:
    """A study with one row per run: its invocations, provenance and runs; with ``append``, the
    invocations and runs already in ``out``'s json come first."""
    result: dict[str, Any] = {
        "argv": invocation,
        "invocations": [invocation],
        **provenance(),
        "runs": [],
    }
    if append:
        earlier = json.loads(out.with_suffix(".json").read_text())
        result["invocations"] = [*earlier.get("invocations", [earlier["argv"]]), invocation]
        result["runs"] = earlier["runs"]
    return result


def add_run(
    out: pathlib.Path, result: dict[str, Any], row: dict[str, Any], page: Callable[[dict], str]
) -> None:
    """Print ``row``, add it to ``result``'s runs and write both files, so a run that stops
    later keeps every finished row."""
    print(json.dumps(row), flush=True)
    result["runs"].append(row)
    write(out, result, page)
