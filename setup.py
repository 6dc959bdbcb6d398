"""The wheel's layout: everything under one import name, `hfta_nas`.

The repository keeps the design card's top-level layout (`hfta_nas/`, `search_spaces/`,
`stability/`, `cli.py`). Installed as top-level modules, `cli`, `stability` and
`search_spaces` would collide with other distributions (a PyPI package is named
`stability`) and with any project's own `cli` module. So the wheel maps the two folders to
`hfta_nas.search_spaces` and `hfta_nas.stability`, and copies `cli.py` to `hfta_nas/cli.py`.
The code imports them by those names; in a clone, `hfta_nas/__init__.py` finds them beside
it. `benchmarks/` stays in the repository (`hfta-nas bench` finds it beside cli.py).
"""

from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

BESIDE = ("search_spaces", "stability")  # folders beside hfta_nas/ that the wheel holds inside it


def packages() -> list[str]:
    found = find_packages(include=["hfta_nas", "hfta_nas.*"])
    for folder in BESIDE:
        found += [f"hfta_nas.{folder}", *(f"hfta_nas.{folder}.{sub}" for sub in find_packages(folder))]
    return found


class BuildWithCli(build_py):
    """build_py, then cli.py into the package: setuptools maps packages to folders, not one module."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:  # an editable install runs the clone, where hfta_nas finds cli.py beside it
            return
        target = Path(self.build_lib) / "hfta_nas"
        self.mkpath(str(target))
        self.copy_file("cli.py", str(target / "cli.py"))


setup(
    packages=packages(),
    package_dir={f"hfta_nas.{folder}": folder for folder in BESIDE},
    cmdclass={"build_py": BuildWithCli},
)
