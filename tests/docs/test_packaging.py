"""Packaging: the sdist and wheel contents, imports without side effects, and the library
standing apart from the training application."""

import email.parser
import json
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOT_SOURCE = shutil.ignore_patterns(
    ".git",
    ".venv",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".pytest_cache",
    ".hypothesis",
    ".benchmarks",
    ".ruff_cache",
    ".mypy_cache",
    "runs",
)


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    """Builds the sdist from a clean copy of the tree and the wheel from that sdist, as pip does.

    The copy keeps the build from writing into the checkout (and from packing a stale build/);
    building the wheel from the sdist checks that the sdist holds everything the wheel needs.
    """
    tmp = tmp_path_factory.mktemp("dists")
    shutil.copytree(ROOT, tmp / "src", ignore=NOT_SOURCE)
    build_sdist = (
        "import sys; from setuptools import build_meta; build_meta.build_sdist(sys.argv[1])"
    )
    subprocess.run(
        [sys.executable, "-c", build_sdist, str(tmp)],
        cwd=tmp / "src",
        check=True,
        capture_output=True,
    )
    (sdist,) = tmp.glob("fastgp_jax-*.tar.gz")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--quiet",
            "-w",
            str(tmp),
            str(sdist),
        ],
        cwd=tmp,
        check=True,
    )
    (wheel,) = tmp.glob("fastgp_jax-*.whl")
    with tarfile.open(sdist) as tar:
        sdist_names = {name.partition("/")[2] for name in tar.getnames()}
    archive = zipfile.ZipFile(wheel)
    dist_info = wheel.name.split("-py3")[0] + ".dist-info"
    metadata = email.parser.Parser().parsestr(archive.read(f"{dist_info}/METADATA").decode())
    return sdist_names, wheel.name, archive.namelist(), metadata


def test_wheel_holds_only_the_fastgp_package(dists):
    _, wheel, names, _ = dists
    dist_info = wheel.split("-py3")[0] + ".dist-info"
    top_level = {name.split("/")[0] for name in names}
    assert top_level == {"fastgp", dist_info}, top_level
    for init in [*(ROOT / "fastgp").rglob("__init__.py"), *(ROOT / "kernels").rglob("__init__.py")]:
        relative = init.relative_to(ROOT).as_posix()
        installed = "fastgp/" + relative if relative.startswith("kernels/") else relative
        assert installed in names, f"{relative} is not in the wheel"
    assert "fastgp/kernels/penalty/tpu.py" in names and "fastgp/kernels/tiling.py" in names
    assert not [name for name in names if re.search(r"(^|/)(tests|benchmarks)/", name)]


def test_wheel_is_named_fastgp_jax_with_the_train_and_tpu_extras(dists):
    """The index's ``fastgp`` is another project, so the distribution is ``fastgp-jax``."""
    _, wheel, _, metadata = dists
    assert wheel.startswith("fastgp_jax-"), wheel
    assert metadata.get_all("Name") == ["fastgp-jax"]
    assert {"train", "tpu", "dev"} <= set(metadata.get_all("Provides-Extra") or [])
    requires = metadata.get_all("Requires-Dist") or []
    assert any(r.startswith("jax[tpu]") and 'extra == "tpu"' in r for r in requires), requires
    assert any(r.startswith("optax") and 'extra == "train"' in r for r in requires), requires


def test_wheel_ships_the_typing_markers_and_the_license(dists):
    _, wheel, names, _ = dists
    dist_info = wheel.split("-py3")[0] + ".dist-info"
    assert "fastgp/py.typed" in names and "fastgp/kernels/py.typed" in names
    assert f"{dist_info}/licenses/LICENSE" in names, [n for n in names if "dist-info" in n]


def test_sdist_holds_the_license_changelog_readme_and_project(dists):
    sdist_names, _, _, _ = dists
    assert {"LICENSE", "CHANGELOG.md", "README.md", "pyproject.toml"} <= sdist_names
    assert {"fastgp/py.typed", "kernels/py.typed"} <= sdist_names


def test_importing_fastgp_configures_no_logging():
    """No fastgp module sets logging levels or handlers when imported; the command does its own."""
    code = """if True:
        import importlib, logging, pkgutil
        import absl.logging

        def levels():
            return (logging.getLogger().level, logging.getLogger("absl").level,
                    absl.logging.get_verbosity())

        before = levels()
        names = ["fastgp.train.run.checkpoints", "fastgp.train.cli"]
        for package in ("fastgp", "fastgp.kernels", "fastgp.train"):
            path = importlib.import_module(package).__path__
            names += [m.name for m in pkgutil.walk_packages(path, package + ".")]
        for name in names:
            importlib.import_module(name)
            assert levels() == before, f"importing {name}: {before} -> {levels()}"
        """
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_the_library_loads_nothing_of_the_training_application():
    code = (
        "import json, sys, fastgp, fastgp.penalty; "
        "print(json.dumps(sorted(m.split('.')[0] if not m.startswith('fastgp') else m "
        "for m in sys.modules)))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"},
    )
    loaded = set(json.loads(proc.stdout.splitlines()[-1]))
    assert "fastgp.penalty" in loaded
    assert not {m for m in loaded if m.startswith("fastgp.train")}
    assert not loaded & {"optax", "orbax", "matplotlib", "rich", "sklearn", "flax", "equinox"}


def test_kernels_import_only_relatively_and_hold_no_policy():
    for path in (ROOT / "kernels").rglob("*.py"):
        text = path.read_text()
        absolute = re.findall(r"^\s*(?:from|import)\s+fastgp\b.*$", text, re.MULTILINE)
        assert not absolute, f"{path.name} imports fastgp absolutely: {absolute}"
        # the device decides nothing here: blocks and interpret modes come from the caller
        assert not re.search(r"jax\.devices\(|get_tpu_info\(\)|default_backend\(", text), path


def test_core_dependencies_are_light():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=\[ ]", dep)[0] for dep in project["dependencies"]}
    assert names == {"jax", "numpy", "einops"}, names
    train = {re.split(r"[<>=\[ ]", dep)[0] for dep in project["optional-dependencies"]["train"]}
    assert {"optax", "orbax-checkpoint", "rich", "matplotlib", "scikit-learn"} <= train


def test_every_install_line_in_the_docs_installs_this_project_with_real_extras():
    """The index's ``fastgp`` is another project: install lines name the source tree (``.``),
    and every extra they name is one pyproject.toml defines."""
    import tomllib

    extras = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    )
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    lines = [
        match for page in pages for match in re.findall(r"pip install ([^`\n]+)", page.read_text())
    ]
    assert lines, "no install line found"
    for line in lines:
        target = re.sub(r"^-e\s+", "", line.strip()).strip("\"'")  # editable or not
        assert target == "." or target.startswith(".["), f"{line!r} does not install the source"
        named = re.findall(r"\[([^\]]+)\]", target)
        for group in named:
            assert set(group.split(",")) <= extras, f"{line!r}: unknown extra"


def test_the_readme_opens_with_one_short_paragraph_saying_what_fastgp_is():
    """A reader decides from the first paragraph: at most 80 words, naming the penalties."""
    text = (ROOT / "README.md").read_text()
    first = text.split("\n\n")[1]  # after the title
    assert first.startswith("fastgp computes"), first[:80]
    assert len(first.split()) <= 80, len(first.split())
    for kind in ("WGAN-GP", "WGAN-LP", "R1", "R2"):
        assert kind in first
