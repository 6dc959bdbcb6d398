"""The wheel carries every file the installed commands read beside the code.

`hfta-nas stability` with no CONFIG reads `stability/configs/mnist1d_cnn.yaml` and
`search_spaces.SHIPPED_SPACES` globs `search_spaces/*.yaml`, both relative to `__file__`: a
wheel without them breaks the commands outside the clone ('file not found'). The list of
files expected is derived from the source tree (every non-Python file under an installed
package), so a data file added later is checked without editing this test.

The wheel installs one import name, `hfta_nas`: the repository's `stability/`,
`search_spaces/` and `cli.py` land inside it (setup.py), never as generic top-level names.
`.ci/install-check` runs the commands themselves from a non-editable install.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from tests._rendezvous import GUARD_S

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("hfta_nas", "search_spaces", "stability")  # the folders setup.py packages
SKIP = {"__pycache__"}


def data_files() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*")):
            relative = path.relative_to(ROOT)
            if path.is_file() and path.suffix not in (".py", ".pyc") and not SKIP & set(relative.parts):
                found.append(installed_name(relative.as_posix()))
    return found


def installed_name(path: str) -> str:
    """Where a repository file lands in the wheel: under `hfta_nas/`, wherever it sits in the clone."""
    return path if path.startswith("hfta_nas/") else f"hfta_nas/{path}"


def build_wheel(out: Path) -> Path:
    """The wheel, built from a copy of the sources: the clone's build/ folder (which setuptools
    reuses, stale files included) and other people's edits in progress stay out of it."""
    source = out / "source"
    source.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in PACKAGES:
        shutil.copytree(ROOT / name, source / name, ignore=ignore)
    for name in ("pyproject.toml", "setup.py", "README.md", "cli.py"):
        shutil.copy2(ROOT / name, source / name)
    command = [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run([*command, "-w", str(out / "dist")], check=True, timeout=GUARD_S, capture_output=True)
    (wheel,) = (out / "dist").glob("*.whl")
    return wheel


def test_the_wheel_holds_every_data_file_the_packages_read(tmp_path):
    expected = data_files()
    assert {"hfta_nas/stability/configs/mnist1d_cnn.yaml", "hfta_nas/search_spaces/mnist1d_cnn.yaml"} <= set(expected)
    wheel = zipfile.ZipFile(build_wheel(tmp_path))
    names = set(wheel.namelist())
    missing = [name for name in expected if name not in names]
    assert not missing, f"the wheel lacks files the installed commands read: {missing} (pyproject.toml package-data)"
    top_level = {name.split("/")[0] for name in names if ".dist-info/" not in name}
    assert top_level == {"hfta_nas"}, f"the wheel claims other top-level names: {sorted(top_level)}"
    (entry_points,) = [name for name in names if name.endswith(".dist-info/entry_points.txt")]
    assert "hfta_nas/cli.py" in names and "hfta-nas = hfta_nas.cli:main" in wheel.read(entry_points).decode()
