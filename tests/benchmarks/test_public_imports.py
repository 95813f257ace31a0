"""The benchmarks measure fastgp as a user would: through its public modules, never ``fastgp._*``,
except where a script writes or reads the library's own tuning table (named here, with why)."""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The GPU sweep writes fastgp/tuned/gpu.json, and the bandwidth script times the launches that
# table gives: both read the table's reader, which only the kernels' bindings use.
TUNING = {"benchmarks/gpu/sweep.py", "benchmarks/gpu/bandwidth.py"}


def _private_imports(path: pathlib.Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found |= {n for n in names if n.startswith("fastgp.") and n.split(".")[1].startswith("_")}
    return found


def test_no_benchmark_imports_a_private_fastgp_module():
    private = {}
    for path in sorted((ROOT / "benchmarks").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        found = _private_imports(path)
        if relative in TUNING:
            found -= {"fastgp._gpu", "fastgp._gpu.tuned"}
        if found:
            private[relative] = sorted(found)
    assert not private, private


def test_the_scan_finds_a_private_import(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("from fastgp import _measure as m\nimport fastgp._penalty.api\n")
    assert _private_imports(planted) == {"fastgp._measure", "fastgp._penalty.api"}
