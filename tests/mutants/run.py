"""Mutation testing: plant each mutant of ``tests/mutants/mutants.py`` in a scratch copy of the
repository and check that its tests fail.

    python tests/mutants/run.py [--only NAME ...] [--rev REV] [--list] [--keep] [--report PATH]

For each mutant: the repository's tracked files (``git ls-files``, as they are in the working
tree; with ``--rev``, as they are in that commit) are copied to a temporary directory, the
mutant's snippet (which must occur exactly once) is replaced there, and its pytest targets run in
that copy with a timeout. The virtual environment stays where it is: pytest runs with the copy as
its working directory and first on ``PYTHONPATH`` (the subprocesses the tests start inherit
both), and ``fastgp/kernels`` in the copy links to the copy's ``kernels/``, because the editable
install maps ``fastgp.kernels`` to this checkout's ``kernels/`` for any ``fastgp`` that lacks
the folder. Before the tests run, a probe imports the mutated module in the copy's environment
and checks that it is the copy's file and holds the mutation.

Verdicts: ``killed`` (a target failed or errored), ``survived`` (every target passed: the tests
lack an input that tells the mutant from the code), ``timeout``, and ``error`` (a harness
problem: the snippet not found exactly once, the probe failed, no test collected, a bad node id).
The table is printed and, for a run of every mutant (or with ``--report``), written as markdown
to ``tests/mutants/report.md``. The exit status is 0 when every mutant was killed.
"""

import argparse
import dataclasses
import datetime
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from mutants import MUTANTS, Mutant

ROOT = Path(__file__).resolve().parents[2]
REPORT = Path(__file__).resolve().parent / "report.md"
VENV_PYTHON = ROOT / ".venv" / "bin" / "python"
FAILED = re.compile(r"^(FAILED|ERROR) (\S.*?)(?: - (.*))?$")

# pytest's exit codes: 0 all passed, 1 some failed, 2 interrupted (e.g. a collection error),
# 3 internal error, 4 usage error (e.g. a node id not found), 5 no tests collected.
KILLED_CODES = {1, 2}


@dataclasses.dataclass
class Result:
    mutant: Mutant
    verdict: str
    killers: list[str]
    seconds: float
    detail: str = ""
    reason: str = ""  # the first failure's message in pytest's short summary


def python() -> str:
    """The project's virtual environment's interpreter, where there is one."""
    return str(VENV_PYTHON) if VENV_PYTHON.exists() else sys.executable


def tracked_files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    return [name for name in out.split("\0") if name]


def archive(rev: str) -> bytes:
    """The tracked files of commit ``rev`` as a tar archive."""
    return subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True).stdout


def copy_repository(source: Sequence[str] | bytes, scratch: Path) -> None:
    """The tracked files, named (as they are in the working tree; a file deleted there is
    skipped) or as a commit's tar archive, and ``fastgp/kernels`` linked to the copy's
    ``kernels/`` (the installed layout)."""
    if isinstance(source, bytes):
        subprocess.run(["tar", "-x", "-C", str(scratch)], input=source, check=True)
    for name in source if not isinstance(source, bytes) else ():
        path = ROOT / name
        if not path.exists() and not path.is_symlink():
            continue
        target = scratch / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target, follow_symlinks=False)
    link = scratch / "fastgp" / "kernels"
    if not link.exists():
        link.symlink_to(Path("..") / "kernels", target_is_directory=True)


def apply(mutant: Mutant, scratch: Path) -> None:
    path = scratch / mutant.file
    if not path.is_file():
        raise HarnessError(f"{mutant.file} is not a tracked file")
    text = path.read_text()
    count = text.count(mutant.old)
    if count != 1:
        raise HarnessError(f"the snippet occurs {count} times in {mutant.file}, not once")
    path.write_text(text.replace(mutant.old, mutant.new))


class HarnessError(Exception):
    pass


def module_of(file: str) -> str | None:
    """The module a library file is imported as (``kernels/`` as ``fastgp.kernels``)."""
    if not file.endswith(".py") or not file.startswith(("fastgp/", "kernels/")):
        return None
    parts = list(Path(file).with_suffix("").parts)
    if parts[0] == "kernels":
        parts.insert(0, "fastgp")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


PROBE = """
import importlib, pathlib, sys
module = importlib.import_module(sys.argv[1])
path = pathlib.Path(module.__file__).resolve()
if not path.is_relative_to(pathlib.Path(sys.argv[2]).resolve()):
    sys.exit(f"{sys.argv[1]} was imported from {path}, outside the scratch copy")
if sys.argv[3] not in path.read_text():
    sys.exit(f"{path} does not hold the mutation")
"""


def environment(scratch: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(scratch), env.get("PYTHONPATH")]))
    env["JAX_PLATFORMS"] = "cpu"
    env["COLUMNS"] = "1000"  # pytest's short summary keeps each failure's message on its line
    env.pop("PYTEST_ADDOPTS", None)
    env.pop("PYTEST_XDIST_WORKER", None)
    return env


def probe(mutant: Mutant, scratch: Path) -> None:
    """Import the mutated module as the tests will and check it is the copy's, mutated."""
    module = module_of(mutant.file)
    if module is None:
        return
    proc = subprocess.run(
        [python(), "-c", PROBE, module, str(scratch), mutant.new],
        cwd=scratch,
        env=environment(scratch),
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        raise HarnessError(f"probe: {(proc.stderr or proc.stdout).strip().splitlines()[-1]}")


def run_pytest(mutant: Mutant, scratch: Path) -> tuple[int | None, str]:
    """(pytest's exit code or None on timeout, its output)."""
    command = [
        python(),
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        "-rfE",
        f"--basetemp={scratch / '.pytest-tmp'}",
        *mutant.targets,
    ]
    proc = subprocess.Popen(
        command,
        cwd=scratch,
        env=environment(scratch),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group: a timeout ends the tests' children too
    )
    try:
        output, _ = proc.communicate(timeout=mutant.timeout)
        return proc.returncode, output
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        return None, output


def killing_tests(output: str) -> tuple[list[str], str]:
    """The node ids pytest's short summary reports as FAILED or ERROR, in order, once each, and
    the first one's message."""
    found: list[str] = []
    reason = ""
    for line in output.splitlines():
        match = FAILED.match(line.strip())
        if match and match.group(2) not in found:
            found.append(match.group(2))
            reason = reason or (match.group(3) or "")
    return found, reason


def run_one(mutant: Mutant, files: Sequence[str] | bytes, keep: bool) -> Result:
    start = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix=f"fastgp-mutant-{mutant.name}-"))
    try:
        copy_repository(files, scratch)
        apply(mutant, scratch)
        probe(mutant, scratch)
        code, output = run_pytest(mutant, scratch)
    except (HarnessError, subprocess.TimeoutExpired) as err:
        return Result(mutant, "error", [], time.monotonic() - start, str(err))
    finally:
        if keep:
            print(f"  kept {scratch}", flush=True)
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    seconds = time.monotonic() - start
    tail = "\n".join(output.strip().splitlines()[-15:])
    killers, reason = killing_tests(output)
    if code is None:
        return Result(mutant, "timeout", killers, seconds, tail, reason)
    if code == 0 and not re.search(r"\b\d+ passed\b", tail):
        return Result(mutant, "error", [], seconds, f"no target test ran\n{tail}")
    if code == 0:
        return Result(mutant, "survived", [], seconds, tail)
    if code in KILLED_CODES and (killers or code == 2):
        return Result(mutant, "killed", killers or ["(collection error)"], seconds, tail, reason)
    return Result(mutant, "error", killers, seconds, f"pytest exit code {code}\n{tail}", reason)


def cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def shorten(text: str, width: int = 90) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def killers_cell(killers: Sequence[str], limit: int = 3) -> str:
    shown = [f"`{k}`" for k in killers[:limit]]
    if len(killers) > limit:
        shown.append(f"and {len(killers) - limit} more")
    return "<br>".join(cell(s) for s in shown) or "-"


def markdown(results: Sequence[Result]) -> str:
    rows = [
        "| mutant | file | description | killed by | first failure | verdict | seconds |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        m = r.mutant
        rows.append(
            f"| {m.name} | `{m.file}` | {cell(m.description)} | {killers_cell(r.killers)} "
            f"| {cell(shorten(r.reason))} | {r.verdict} | {r.seconds:.0f} |"
        )
    return "\n".join(rows)


def revision(rev: str | None) -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout

    head = git("rev-parse", "--short", rev or "HEAD").strip()
    if rev is not None:
        return f"commit {head}"
    dirty = bool(git("status", "--porcelain", "--untracked-files=no").strip())
    return head + (" with uncommitted changes" if dirty else "")


def write_report(path: Path, results: Sequence[Result], total: float, rev: str | None) -> None:
    counts = {v: sum(r.verdict == v for r in results) for v in ("killed", "survived")}
    others = len(results) - counts["killed"] - counts["survived"]
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Mutation testing report",
        "",
        (
            f"`python tests/mutants/run.py{'' if rev is None else ' --rev ' + rev}` on "
            f"{revision(rev)}, {when}: {len(results)} mutants, "
            f"{counts['killed']} killed, {counts['survived']} survived, {others} timed out or "
            f"errored, {total:.0f} s. The mutants and their targets are "
            "`tests/mutants/mutants.py`; how to run them is in docs/development.md (Mutation "
            "testing)."
        ),
        "",
        markdown(results),
        "",
    ]
    details = [r for r in results if r.verdict not in ("killed",)]
    if details:
        lines += ["## Not killed", ""]
        for r in details:
            lines += [f"`{r.mutant.name}` ({r.verdict}):", "", "```", r.detail, "```", ""]
    path.write_text("\n".join(lines))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run these mutants only")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument(
        "--rev", help="copy the tracked files of this commit (default: the working tree's)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the scratch copies")
    parser.add_argument(
        "--report",
        type=Path,
        help=f"write the markdown table here (default: {REPORT.relative_to(ROOT)} when every "
        "mutant runs, nowhere with --only)",
    )
    args = parser.parse_args(argv)
    names = [m.name for m in MUTANTS]
    if len(set(names)) != len(names):
        parser.error("mutant names repeat in mutants.py")
    if args.list:
        for m in MUTANTS:
            print(f"{m.name:24} {m.file:32} {m.description}")
        return 0
    unknown = sorted(set(args.only or ()) - set(names))
    if unknown:
        parser.error(f"no mutant named {', '.join(unknown)} (choose from {', '.join(names)})")
    chosen = [m for m in MUTANTS if not args.only or m.name in args.only]
    files = tracked_files() if args.rev is None else archive(args.rev)
    results: list[Result] = []
    start = time.monotonic()
    for i, mutant in enumerate(chosen, 1):
        print(f"[{i}/{len(chosen)}] {mutant.name}: {mutant.description}", flush=True)
        result = run_one(mutant, files, args.keep)
        print(f"  {result.verdict} in {result.seconds:.0f} s", flush=True)
        if result.verdict != "killed":
            print("  " + result.detail.replace("\n", "\n  "), flush=True)
        results.append(result)
    total = time.monotonic() - start
    print()
    print(markdown(results))
    report = args.report or (None if args.only else REPORT)
    if report is not None:
        write_report(report, results, total, args.rev)
        print(f"\nwritten to {report}")
    return 0 if all(r.verdict == "killed" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
