"""The built wheel installs the kernels as ``fastgp.kernels`` and nothing at top level but fastgp."""

import pathlib
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
