"""A pytest plugin: when a pytest-xdist worker dies of a fatal signal (a segfault, or an abort in
native code), its threads' Python stacks and the test it was running go to a file, and the run's
summary prints them at its end, where a log's tail shows them (the worker's own stderr lands in
the middle of the output)."""

import faulthandler
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

_FOLDER = "FASTGP_CRASH_REPORTS"
_file = None


@pytest.hookimpl(trylast=True)  # after pytest's faulthandler plugin, which writes to stderr
def pytest_configure(config: pytest.Config) -> None:
    global _file
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:  # the controller, before it starts workers, which inherit the variable
        os.environ[_FOLDER] = tempfile.mkdtemp(prefix="fastgp-crashes-")
    elif _FOLDER in os.environ:
        _file = open(Path(os.environ[_FOLDER]) / f"{worker}.txt", "w")  # noqa: SIM115 (held open for the process's life)
        faulthandler.enable(file=_file, all_threads=True)


def pytest_runtest_logstart(nodeid: str) -> None:
    if _file is not None:
        _file.seek(0)
        _file.truncate()
        _file.write(f"while running {nodeid}:\n")
        _file.flush()


def _condensed(lines: list[str]) -> list[str]:
    """The test, the signal, and the innermost frames of the thread it hit (most recent first)."""
    start = next((i for i, line in enumerate(lines) if line.startswith("Current thread")), None)
    if start is None:
        return lines[:40]
    end = next((i for i in range(start + 1, len(lines)) if not lines[i].strip()), len(lines))
    others = sum(line.startswith("Thread 0x") for line in lines)
    fatal = [line for line in lines[1:start] if line.startswith("Fatal Python error")]
    return [lines[0], *fatal, *lines[start : min(end, start + 17)], f"(and {others} other threads)"]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER") or _FOLDER not in os.environ:
        return
    folder = Path(os.environ[_FOLDER])
    for path in sorted(folder.glob("*.txt")):
        lines = path.read_text().splitlines()
        if len(lines) > 1:  # more than the running test's line: a fatal signal's stacks
            terminalreporter.section(f"worker {path.stem} died of a fatal signal")
            for line in _condensed(lines):
                terminalreporter.write_line(line)
    shutil.rmtree(folder, ignore_errors=True)
