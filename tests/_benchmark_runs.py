"""Running a benchmark's script as a user does, from the checkout (benchmarks/ is not an installed package)."""

import os
import subprocess
import sys
from pathlib import Path

from tests._rendezvous import GUARD_S

ROOT = Path(__file__).resolve().parents[1]


def run_from_checkout(*args: str) -> subprocess.CompletedProcess:
    """`python ARGS` in the repository root with the checkout first on PYTHONPATH; the calling test fails,
    with the end of stderr, unless it exits 0."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    completed = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=GUARD_S
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    return completed
