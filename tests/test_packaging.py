"""Packaging: the wheel's layout, and the library standing apart from the training application."""

import json
import pathlib
import re
import subprocess
import sys
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_wheel_holds_only_the_fastgp_package(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--quiet", "-w", str(tmp_path), str(ROOT)], check=True, cwd=tmp_path)
    (wheel,) = tmp_path.glob("fastgp-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/")[0] for name in names}
    assert top_level == {"fastgp", wheel.name.split("-py3")[0] + ".dist-info"}, top_level
    assert "fastgp/kernels/penalty_tpu.py" in names and "fastgp/kernels/tiling.py" in names


def test_the_library_loads_nothing_of_the_training_application():
    code = ("import json, sys, fastgp, fastgp.penalty; "
            "print(json.dumps(sorted(m.split('.')[0] if not m.startswith('fastgp') else m "
            "for m in sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={"JAX_PLATFORMS": "cpu", "PATH": "/usr/bin:/bin"})
    loaded = set(json.loads(proc.stdout.splitlines()[-1]))
    assert "fastgp.penalty" in loaded
    assert not {m for m in loaded if m.startswith("fastgp.train")}
    assert not loaded & {"optax", "orbax", "matplotlib", "rich", "sklearn", "flax", "equinox"}


def test_kernels_import_only_relatively_and_hold_no_policy():
    for path in (ROOT / "kernels").glob("*.py"):
        text = path.read_text()
        absolute = re.findall(r"^\s*(?:from|import)\s+fastgp\b.*$", text, re.MULTILINE)
        assert not absolute, f"{path.name} imports fastgp absolutely: {absolute}"


def test_core_dependencies_are_light():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=\[ ]", dep)[0] for dep in project["dependencies"]}
    assert names == {"jax", "numpy", "einops"}, names
    train = {re.split(r"[<>=\[ ]", dep)[0] for dep in project["optional-dependencies"]["train"]}
    assert {"optax", "orbax-checkpoint", "rich", "matplotlib", "scikit-learn"} <= train
