"""The training application's layout: one folder per job, imports flowing one way, no circle.

``fastgp/train/`` holds one folder per job, in layers: data and models at the bottom (neither
imports the other), then objective, config, trainers, recipes, run and cli. A module may import
from its own folder and from the folders of lower layers, never from a higher layer or a peer; no
module imports itself back through others; the library (``fastgp/`` outside ``train/``) imports
nothing of it. Every import counts, those inside functions too (found with ``ast``, nothing is run).
"""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
TRAIN = ROOT / "fastgp" / "train"
# folder -> layer: a module may import from its own folder and from folders of a lower layer.
LAYERS = {
    **{"data": 0, "models": 0, "objective": 1, "config": 2, "trainers": 3},
    **{"recipes": 4, "run": 5, "cli": 6},
}


def module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def application_modules() -> dict[str, pathlib.Path]:
    return {module_name(path): path for path in sorted(TRAIN.rglob("*.py"))}


def imported_modules(path: pathlib.Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``path`` imports: ``from P import name`` counts as P.name
    where that is a module, else as P; relative imports are resolved against ``path``."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path.parent)
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return {name for name in found if name in known}


def import_graph() -> dict[str, set[str]]:
    modules = application_modules()
    return {name: imported_modules(path, set(modules)) - {name} for name, path in modules.items()}


def folder(module: str) -> str | None:
    """The job folder of a module of fastgp.train (None for fastgp.train itself)."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 else None


def test_every_module_is_in_a_layered_folder():
    loose = [
        name
        for name in application_modules()
        if name != "fastgp.train" and folder(name) not in LAYERS
    ]
    assert not loose, f"modules outside the folders of LAYERS {sorted(LAYERS)}: {loose}"
    assert sorted(path.name for path in TRAIN.glob("*.py")) == ["__init__.py"]


def test_the_graph_sees_the_imports():
    """The parser finds known edges, lazy and ``from package import module`` ones included."""
    graph = import_graph()
    assert "fastgp.train.run.check" in graph["fastgp.train.cli.main"]  # from ..run import check
    assert "fastgp.train.run.loop" in graph["fastgp.train.cli.main"]  # inside a function
    assert "fastgp.train.data.sets" in graph["fastgp.train.data.quality"]


def test_imports_go_down_the_layers_only():
    wrong = []
    for name, imports in import_graph().items():
        for other in imports:
            mine, theirs = folder(name), folder(other)
            if mine is None or theirs is None:
                wrong.append(f"{name} imports {other}")  # fastgp.train: the map, no code
            elif mine != theirs and not LAYERS[theirs] < LAYERS[mine]:
                wrong.append(f"{name} ({mine}, layer {LAYERS[mine]}) imports {other} ({theirs})")
    assert not wrong, "imports against the layers:\n" + "\n".join(sorted(wrong))


def test_no_import_circle():
    graph = import_graph()
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            raise AssertionError("import circle: " + " -> ".join([*path[path.index(name) :], name]))
        if name in done:
            return
        for other in sorted(graph[name]):
            visit(other, [*path, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])


def test_the_library_imports_nothing_of_the_application():
    library = [path for path in (ROOT / "fastgp").rglob("*.py") if TRAIN not in path.parents]
    known = set(application_modules())
    wrong = {
        module_name(path): imports
        for path in library
        if (imports := imported_modules(path, known | {"fastgp.train"}))
    }
    assert not wrong, wrong


# fastgp.train uses the library's public API; these private names it takes on purpose, each with
# a comment at its import saying why.
PRIVATE_ON_PURPOSE = {
    "fastgp.train.trainers.naive_trainer": {"fastgp._penalty.reference"},
    "fastgp.train.run.check_scales": {"fastgp._approximate.api", "fastgp._penalty.reference"},
    "fastgp.train.trainers.trainer": {"fastgp._backends"},
}


def test_the_application_uses_the_public_api_but_for_named_exceptions():
    found = {}
    for name, path in application_modules().items():
        private = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module:
                named = [f"fastgp.{a.name}" for a in node.names] if node.module == "fastgp" else []
                modules = [node.module, *named]
                private |= {m for m in modules if m.startswith("fastgp._")}
        if private - PRIVATE_ON_PURPOSE.get(name, set()):
            found[name] = sorted(private)
        if name in PRIVATE_ON_PURPOSE:
            assert "Private on purpose" in path.read_text(), name
    assert not found, found
